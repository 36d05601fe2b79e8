-- usage (the usage hour's slot): add finished requests' usage to their tenants' hour.
-- A script rather than plain HINCRBYs so that a round trip resent after NOSCRIPT (a
-- Redis restart, see shared/scripts.py) cannot count it twice: it fails as a whole.
-- KEYS[1] usage hash of the hour
-- ARGV[1] retention s   then sixes: tenant, prompt tokens, completion tokens, requests,
--         prompt tokens looked up in the prefix cache, of those found cached
-- Returns the number of requests counted.
local n = 0
for a = 2, #ARGV, 6 do
  redis.call('HINCRBY', KEYS[1], 'prompt:' .. ARGV[a], ARGV[a + 1])
  redis.call('HINCRBY', KEYS[1], 'completion:' .. ARGV[a], ARGV[a + 2])
  redis.call('HINCRBY', KEYS[1], 'requests:' .. ARGV[a], ARGV[a + 3])
  redis.call('HINCRBY', KEYS[1], 'cache_queried:' .. ARGV[a], ARGV[a + 4])
  redis.call('HINCRBY', KEYS[1], 'cache_hits:' .. ARGV[a], ARGV[a + 5])
  n = n + tonumber(ARGV[a + 3])
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return n
