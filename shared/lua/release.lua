-- release: a stopping worker hands back requests it will not finish. They go to the
-- front of their priority band and resume elsewhere; a hand-back is not a failure,
-- so the attempt it used is given back.
-- KEYS[1] leases   KEYS[2] owners   KEYS[3] queue   KEYS[4] wakeup list
-- KEYS[4 + i] request hash of id i (i from 1)
-- ARGV[1] lifecycle channel   then pairs: ARGV[2i] id i, ARGV[2i + 1] lease token i
-- Returns the number handed back.
local released = 0
for i = 1, #KEYS - 4 do
  local id, token, h = ARGV[2 * i], ARGV[2 * i + 1], KEYS[4 + i]
  if redis.call('HGET', KEYS[2], id) == token then
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
    put_back(h, KEYS[3], id)
    redis.call('HINCRBY', h, 'attempts', -1)
    redis.call('PUBLISH', ARGV[1], cjson.encode({event = 'released', id = id}))
    released = released + 1
  end
end
if released > 0 then wake(KEYS[4]) end
return released
