-- renew (the model's slot): extend the leases a worker still holds; report lost ones.
-- Cancels reach the worker through publish's reply and the heartbeat's read of each
-- request's 'cancel' flag, on the requests' own slots.
-- KEYS[1] leases   KEYS[2] owners
-- ARGV[1] lease ms   then pairs: ARGV[2i] id i, ARGV[2i + 1] lease token i
-- Returns one code per id: 0 lease lost, 1 renewed.
local expiry = now_ms() + tonumber(ARGV[1])
local out = {}
for i = 1, (#ARGV - 1) / 2 do
  local id, token = ARGV[2 * i], ARGV[2 * i + 1]
  if redis.call('HGET', KEYS[2], id) == token then
    redis.call('ZADD', KEYS[1], 'XX', expiry, id)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
