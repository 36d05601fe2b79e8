-- Helpers prepended to every script (after MAX_PRIORITY, SCORE_BAND and FRESH_OFFSET,
-- which come from shared/priority.py). Timestamps come from Redis's own clock so
-- that producers and workers on different hosts agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function secs_between(h, from_field, to_ms)
  local from = redis.call('HGET', h, from_field)
  if not from or not to_ms then return cjson.null end
  return (tonumber(to_ms) - tonumber(from)) / 1000.0
end

-- Timings of a request hash as seen at finished_ms.
local function timings(h, finished_ms)
  local started = redis.call('HGET', h, 'started_ms')
  local first = redis.call('HGET', h, 'first_token_ms')
  return {
    queued_s = secs_between(h, 'created_ms', started or finished_ms),
    ttft_s = secs_between(h, 'created_ms', first),
    total_s = secs_between(h, 'created_ms', finished_ms),
  }
end

-- Bounded indexes of ended requests, for dashboards: all of them, and the failed.
local HISTORY_MAX = 1000
local function remember(history, id, state, at_ms)
  redis.call('ZADD', history[1], at_ms, id)
  redis.call('ZREMRANGEBYRANK', history[1], 0, -HISTORY_MAX - 1)
  if state == 'failed' or state == 'dead' then
    redis.call('ZADD', history[2], at_ms, id)
    redis.call('ZREMRANGEBYRANK', history[2], 0, -HISTORY_MAX - 1)
  end
end

-- End a request: final event on its stream, terminal state, expiry, notification.
-- history: {recent index key, failed index key}
local function finalize(h, stream, history, id, state, final_json, finished_ms, ttl_s, channel)
  local final = cjson.decode(final_json)
  final['timings'] = timings(h, finished_ms)
  local encoded = cjson.encode(final)
  redis.call('XADD', stream, '*', 'e', encoded)
  redis.call('HSET', h, 'state', state, 'finish_reason', final['finish_reason'],
    'final', encoded, 'finished_ms', finished_ms)
  redis.call('HDEL', h, 'lease_token')
  redis.call('EXPIRE', h, ttl_s)
  redis.call('EXPIRE', stream, ttl_s)
  redis.call('PUBLISH', channel, cjson.encode({event = state, id = id}))
  remember(history, id, state, finished_ms)
  return encoded
end

-- A queue score (see shared/priority.py): work put back after its worker died or
-- stopped before all new work; by priority, then arrival, within each.
local function queue_score(priority, seq, resumed)
  local score = (MAX_PRIORITY - tonumber(priority)) * SCORE_BAND + tonumber(seq)
  if resumed then return score end
  return score + FRESH_OFFSET
end

-- Wake one idle worker blocked on the model's wakeup list (a list of at most one item).
local function wake(wakeup)
  redis.call('LPUSH', wakeup, '1')
  redis.call('LTRIM', wakeup, 0, 0)
end

-- Put a running request back in the queue, ahead of new work, with no worker.
local function put_back(h, queue, id)
  local priority, seq = unpack(redis.call('HMGET', h, 'priority', 'seq'))
  redis.call('ZADD', queue, queue_score(priority, seq, true), id)
  redis.call('HSET', h, 'state', 'queued')
  redis.call('HDEL', h, 'worker', 'lease_token')
end

-- The final event of a request that ends before producing anything.
local function unstarted_final(reason, error)
  return cjson.encode({type = 'final', finish_reason = reason,
    usage = {prompt_tokens = 0, completion_tokens = 0}, error = error})
end
local EXPIRED_JSON = unstarted_final('expired', 'deadline passed while queued')
local CANCELLED_JSON = unstarted_final('cancelled', cjson.null)
