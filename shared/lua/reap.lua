-- reap: put back requests whose lease expired (their worker died or stalled) and
-- expire queued requests whose deadline passed. The caller holds the reaper lock
-- and passes candidates from ZRANGEBYSCORE; each is checked again here.
-- KEYS[1] leases   KEYS[2] owners   KEYS[3] queue   KEYS[4] dead-letter set
-- KEYS[5] deadlines   KEYS[6] wakeup list   KEYS[7] recent index   KEYS[8] failed index
-- KEYS[9 + 2i], KEYS[10 + 2i]: request hash and stream of candidate i (i from 0)
-- ARGV[1] max attempts   ARGV[2] ttl s   ARGV[3] lifecycle channel
-- ARGV[4 + i] candidate id i
-- Returns {requeued, dead, ended} counts (ended: expired while queued, or cancelled).
local now = now_ms()
local counts = {0, 0, 0}

local function requeue(h, id)
  put_back(h, KEYS[3], id)
  wake(KEYS[6])
  redis.call('PUBLISH', ARGV[3], cjson.encode({event = 'requeued', id = id}))
end

local function bury(h, stream, id, attempts)
  local reason = 'worker lost ' .. attempts .. ' times (last: ' ..
    (redis.call('HGET', h, 'worker') or '?') .. '); attempts exhausted'
  local final = cjson.encode({type = 'final', finish_reason = 'error',
    usage = {prompt_tokens = 0, completion_tokens = tonumber(redis.call('HGET', h, 'num_generated') or '0')},
    error = reason})
  finalize(h, stream, {KEYS[7], KEYS[8]}, id, 'dead', final, now, ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[4], now, id)
  redis.call('HSET', h, 'dead_reason', reason)
  redis.call('PERSIST', h)
  redis.call('PERSIST', stream)
end

local function reclaim(h, stream, id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  local attempts = tonumber(redis.call('HGET', h, 'attempts') or '0')
  if redis.call('HGET', h, 'cancel') == '1' then
    -- Cancelled while its worker was dying: end it rather than run it again.
    finalize(h, stream, {KEYS[7], KEYS[8]}, id, 'cancelled', CANCELLED_JSON, now, ARGV[2], ARGV[3])
    counts[3] = counts[3] + 1
  elseif attempts >= tonumber(ARGV[1]) then
    bury(h, stream, id, attempts)
    counts[2] = counts[2] + 1
  else
    requeue(h, id)
    counts[1] = counts[1] + 1
  end
end

for i = 0, #ARGV - 4 do
  local id = ARGV[4 + i]
  local h, stream = KEYS[9 + 2 * i], KEYS[10 + 2 * i]
  local expiry = redis.call('ZSCORE', KEYS[1], id)
  local deadline = redis.call('ZSCORE', KEYS[5], id)
  if expiry and tonumber(expiry) <= now then
    reclaim(h, stream, id)
  elseif deadline and tonumber(deadline) <= now and redis.call('ZREM', KEYS[3], id) == 1 then
    redis.call('ZREM', KEYS[5], id)
    finalize(h, stream, {KEYS[7], KEYS[8]}, id, 'expired', EXPIRED_JSON, now, ARGV[2], ARGV[3])
    counts[3] = counts[3] + 1
  end
end
return counts
