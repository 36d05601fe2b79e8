-- release: a stopping worker hands back requests it will not finish. They go to the
-- front of their priority band and resume elsewhere; a hand-back is not a failure,
-- so the attempt it used is given back.
-- KEYS[1] leases   KEYS[2] owners   KEYS[3] queue   KEYS[4] wakeup list
-- KEYS[4 + i] request hash of id i (i from 1)
-- ARGV[1] lifecycle channel   ARGV[2] max priority   then pairs: ARGV[1 + 2i] id i,
-- ARGV[2 + 2i] lease token i
-- Returns the number handed back.
local released = 0
for i = 1, #KEYS - 4 do
  local id, token, h = ARGV[1 + 2 * i], ARGV[2 + 2 * i], KEYS[4 + i]
  if redis.call('HGET', KEYS[2], id) == token then
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    local priority, seq = unpack(redis.call('HMGET', h, 'priority', 'seq'))
    local band = tonumber(ARGV[2]) - tonumber(priority)
    redis.call('ZADD', KEYS[3], band * 70368744177664 + tonumber(seq), id)
    redis.call('HSET', h, 'state', 'queued')
    redis.call('HINCRBY', h, 'attempts', -1)
    redis.call('HDEL', h, 'worker', 'lease_token')
    redis.call('PUBLISH', ARGV[1], cjson.encode({event = 'released', id = id}))
    released = released + 1
  end
end
if released > 0 then
  redis.call('LPUSH', KEYS[4], '1')
  redis.call('LTRIM', KEYS[4], 0, 0)
end
return released
