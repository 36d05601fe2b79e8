-- renew_owned (the model's slot): extend every lease that owners gives to one worker, for
-- its lease keeper (worker/lease_keeper.py), which renews while the worker's own
-- heartbeat cannot run. The keeper knows no request ids: a lease token is
-- '<worker id>:<n>' (claim.lua), so owners already says which leases are the worker's.
-- Only when the heartbeat is late, so the walk over owners is rare.
-- KEYS[1] leases   KEYS[2] owners
-- ARGV[1] lease ms   ARGV[2] worker id
-- Returns how many leases it extended.
local expiry = now_ms() + tonumber(ARGV[1])
local owners = redis.call('HGETALL', KEYS[2])
local n = 0
for i = 1, #owners, 2 do
  if string.match(owners[i + 1], '^(.*):%d+$') == ARGV[2] then
    n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', expiry, owners[i])
  end
end
return n
