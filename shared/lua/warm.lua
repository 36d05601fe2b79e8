-- warm (the model's slot): replace a worker's warm set, the prefix fingerprints it holds
-- in its prefix cache (shared/prefixes.py), for claim.lua to prefer. Sent with each
-- heartbeat, it expires with the worker: a dead worker's set stops counting. The model's
-- publishers are kept beside the sets, so that each worker learns its peers' and its
-- claims leave a request warm on a peer to that peer (claim.lua).
-- KEYS[1] the worker's warm set   KEYS[2] publishers (zset worker id -> expiry ms)
-- ARGV[1] ttl ms   ARGV[2] worker id   ARGV[3] peers returned at most
-- ARGV[4..] the fingerprints (none: the set is dropped)
-- Returns {the number of fingerprints kept, {the other live publishers, newest first}}.
local STEP = 500  -- arguments per SADD (unpack's stack stays small)
local FIRST_FP = 4
local now = now_ms()
redis.call('DEL', KEYS[1])
for first = FIRST_FP, #ARGV, STEP do
  redis.call('SADD', KEYS[1], unpack(ARGV, first, math.min(first + STEP - 1, #ARGV)))
end
if #ARGV >= FIRST_FP then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[1]), ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local peers = {}
for _, id in ipairs(redis.call('ZREVRANGE', KEYS[2], 0, tonumber(ARGV[3]))) do
  if id ~= ARGV[2] and #peers < tonumber(ARGV[3]) then table.insert(peers, id) end
end
return {math.max(#ARGV - FIRST_FP + 1, 0), peers}
