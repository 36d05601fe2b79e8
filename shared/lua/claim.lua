-- claim (step 1 of 2, the model's slot): take candidate requests off the queue and
-- lease them. The caller peeks candidates (ZRANGE); one another worker took first is
-- skipped, so claims never double-assign. start.lua then runs each on its own slot
-- and settle.lua drops the leases of those that may not start.
-- KEYS[1] queue   KEYS[2] leases (zset id -> expiry ms)   KEYS[3] owners (hash id -> token)
-- KEYS[4] scores (hash id -> resumed queue score)   KEYS[5] seq counter
-- KEYS[6] fair clock   KEYS[7] fair tags (new work moves its band's clock; _lib.lua)
-- ARGV[1] worker id   ARGV[2] lease ms   ARGV[3..] candidate ids
-- Returns a flat list: id, lease token for each leased request.
local expiry = now_ms() + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[1], id)
  -- An id held under a lease is already someone's; its queue entry is a stale hint.
  if score and redis.call('ZREM', KEYS[1], id) == 1 and redis.call('HEXISTS', KEYS[3], id) == 0 then
    local token = ARGV[1] .. ':' .. redis.call('INCR', KEYS[5])
    score = tonumber(score)
    if score >= FRESH_OFFSET then
      score = score - FRESH_OFFSET
      fair_advance(KEYS[1], KEYS[6], KEYS[7], score)
    end
    redis.call('HSET', KEYS[3], id, token)
    redis.call('HSET', KEYS[4], id, score)
    redis.call('ZADD', KEYS[2], expiry, id)
    table.insert(out, id)
    table.insert(out, token)
  end
end
return out
