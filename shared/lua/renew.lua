-- renew: extend the leases a worker still holds; report lost and cancelled ones.
-- KEYS[1] leases   KEYS[2] owners   KEYS[2 + i] request hash of id i (i from 1)
-- ARGV[1] lease ms   then pairs: ARGV[2i] id i, ARGV[2i + 1] lease token i
-- Returns one code per id: 0 lease lost, 1 renewed, 2 renewed and cancel requested.
local expiry = now_ms() + tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS - 2 do
  local id, token = ARGV[2 * i], ARGV[2 * i + 1]
  if redis.call('HGET', KEYS[2], id) == token then
    redis.call('ZADD', KEYS[1], 'XX', expiry, id)
    out[i] = (redis.call('HGET', KEYS[2 + i], 'cancel') == '1') and 2 or 1
  else
    out[i] = 0
  end
end
return out
