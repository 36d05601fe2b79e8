-- Helpers prepended to every script (after MAX_PRIORITY, SCORE_BAND and FRESH_OFFSET,
-- which come from shared/priority.py). Timestamps come from Redis's own clock so
-- that producers and workers on different hosts agree.
--
-- How a request's state is kept across two hash slots (DESIGN: "Redis data model").
-- The request hash, on the request's slot, is the authority: its 'state' and its
-- 'lease_token' say who may write. The model's keys (queue, leases, owners, scores,
-- deadlines, dead letters, history), on the model's slot, are an index of it that
-- may briefly lag. So every change that spans both runs as two one-slot scripts, the
-- request's first ("fence on the request's shard, then move the id on the model's"):
--   * A queue entry is only a hint: start.lua runs a request only if its hash still
--     says 'queued' and the claim is newer than any revoked one, so a stale entry
--     (left by a crash, a cancel or a retried enqueue) is dropped at claim, never run.
--   * Lease tokens carry a generation (INCR of the model's seq counter). fence.lua
--     records the generation it revokes in 'lease_gen', so a claim whose start was
--     delayed past its reaping can never start later.
--   * settle.lua, the model step after finish, fence, start or cancel, is fenced by
--     the owners entry and idempotent: if a process dies before it runs, the lease
--     stays and expires, and the reaper's fence + settle finish the job from the
--     hash's state. Nothing accepted is lost and nothing is written twice.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The generation of a lease token ('<worker>:<generation>').
local function token_gen(token)
  return tonumber(string.match(token, ':(%d+)$') or '0')
end

local function secs_between(from, to_ms)
  if not from or not to_ms then return cjson.null end
  return (tonumber(to_ms) - tonumber(from)) / 1000.0
end

-- Timings of a request hash as seen at finished_ms. 'known': its created_ms, started_ms
-- and first_token_ms when the caller read them already (false where absent), or nil.
local function timings(h, finished_ms, known)
  local created, started, first = unpack(known or redis.call('HMGET', h, 'created_ms',
    'started_ms', 'first_token_ms'))
  return {
    queued_s = secs_between(created, started or finished_ms),
    ttft_s = secs_between(created, first),
    total_s = secs_between(created, finished_ms),
  }
end

-- End a request on its own slot: final event on its stream, terminal state, expiry,
-- notification. The model's indexes learn of it from settle.lua. 'final_json': the final
-- event, a JSON object without its timings, which are added here as its last field (by
-- splicing, not decoding: a final can be long, an embedding's most of all), and 'reason'
-- its finish reason. 'extra': more fields to set with the state, as a flat list (field,
-- value, ...), or nil. 'known': see timings.
local function finalize(h, stream, id, state, reason, final_json, finished_ms, ttl_s, channel,
    extra, known)
  local encoded = string.sub(final_json, 1, -2) .. ',"timings":' ..
    cjson.encode(timings(h, finished_ms, known)) .. '}'
  redis.call('XADD', stream, '*', 'e', encoded)
  redis.call('HSET', h, 'state', state, 'finish_reason', reason,
    'final', encoded, 'finished_ms', finished_ms, unpack(extra or {}))
  redis.call('HDEL', h, 'lease_token')
  redis.call('EXPIRE', h, ttl_s)
  redis.call('EXPIRE', stream, ttl_s)
  redis.call('PUBLISH', channel, cjson.encode({event = state, id = id}))
  return encoded
end

-- Keep a dead-lettered request (and its stream) until an operator retries or purges it.
local function keep_dead(h, stream, reason)
  redis.call('HSET', h, 'dead_reason', reason)
  redis.call('PERSIST', h)
  redis.call('PERSIST', stream)
end

-- A queue score (see shared/priority.py): work put back mid-answer after its worker
-- died or stopped before all new work; by priority, then arrival, within each.
local function queue_score(priority, seq, resumed)
  local score = (MAX_PRIORITY - tonumber(priority)) * SCORE_BAND + tonumber(seq)
  if resumed then return score end
  return score + FRESH_OFFSET
end

-- Weighted fair order within a band (see shared/fairness.py): 'clock' is a hash
-- priority -> the band's virtual time V, 'tags' a zset '<priority>:<tenant>' -> band
-- base + the tenant's virtual finish time F. Numbers stay below 2^53 and are passed to
-- redis.call as numbers (exact), never through tostring (14 digits).
local function band_base(priority)
  return (MAX_PRIORITY - tonumber(priority)) * SCORE_BAND
end

local function band_clock(clock, priority)
  return tonumber(redis.call('HGET', clock, priority) or '0')
end

-- Charge a tenant 'units' of virtual time in a band: returns where its new work
-- starts, max(F, V), so that an idle tenant comes back level with the clock and
-- banks no credit.
local function fair_charge(clock, tags, priority, member, units)
  local base = band_base(priority)
  local finish = redis.call('ZSCORE', tags, member)
  finish = finish and tonumber(finish) - base or 0
  local start = math.min(math.max(finish, band_clock(clock, priority)), SCORE_BAND - 1)
  redis.call('ZADD', tags, base + math.min(start + tonumber(units), SCORE_BAND - 1), member)
  return start
end

-- New work scored 'score' (new-work region removed) was claimed off 'queue': its
-- band's clock moves up to its start tag, and tenants whose finish the clock has
-- passed are dropped (max(F, V) gives V for them anyway). Once the band has no new
-- work left every tenant is idle: the clock moves to the latest finish and the band's
-- tags are dropped. So the tags hold only tenants ahead of a busy band's clock.
local function fair_advance(queue, clock, tags, score)
  local start = score % SCORE_BAND
  local base = score - start
  local priority = tostring(MAX_PRIORITY - math.floor(base / SCORE_BAND))
  local clock_now = math.max(start, band_clock(clock, priority))
  if redis.call('ZCOUNT', queue, FRESH_OFFSET + base, FRESH_OFFSET + base + SCORE_BAND - 1) == 0 then
    local last = redis.call('ZREVRANGEBYSCORE', tags, base + SCORE_BAND - 1, base, 'WITHSCORES',
      'LIMIT', 0, 1)
    if last[2] then clock_now = math.max(clock_now, tonumber(last[2]) - base) end
    redis.call('ZREMRANGEBYSCORE', tags, base, base + SCORE_BAND - 1)
  else
    redis.call('ZREMRANGEBYSCORE', tags, base, base + clock_now)
  end
  redis.call('HSET', clock, priority, clock_now)
end

-- Wake one idle worker blocked on the model's wakeup list (a list of at most one item).
-- While every worker is busy the item stays there: a read instead of two writes.
local function wake(wakeup)
  if redis.call('LLEN', wakeup) == 0 then redis.call('LPUSH', wakeup, '1') end
end

-- The final event of a request that ends before producing anything.
local function unstarted_final(reason, error)
  return cjson.encode({type = 'final', finish_reason = reason,
    usage = {prompt_tokens = 0, completion_tokens = 0}, error = error})
end
-- Functions, not values: this library runs on every call of every script, and most
-- calls (a publish per write, most of all) never need them encoded.
local function expired_json() return unstarted_final('expired', 'deadline passed while queued') end
local function cancelled_json() return unstarted_final('cancelled', cjson.null) end

-- redis.call(command, key, items...) in calls of at most CHUNK items (even, so score and
-- member pairs stay together), so a long list never overflows Lua's stack.
local CHUNK = 1000
local function call_chunked(command, key, items)
  for first = 1, #items, CHUNK do
    redis.call(command, key, unpack(items, first, math.min(first + CHUNK - 1, #items)))
  end
end
-- HMGET of every field in 'fields' (in chunks), as one list.
local function hmget_all(key, fields)
  local out = {}
  for first = 1, #fields, CHUNK do
    local part = redis.call('HMGET', key, unpack(fields, first, math.min(first + CHUNK - 1, #fields)))
    for n = 1, #part do out[first + n - 1] = part[n] end
  end
  return out
end
