-- publish: append one token event to a running request's stream, fenced by its lease.
-- KEYS[1] owners   KEYS[2] request hash   KEYS[3] stream
-- ARGV[1] id   ARGV[2] lease token   ARGV[3] event json   ARGV[4] number of new tokens
-- Returns 0 when the lease is lost (nothing written), 1 when published,
-- 2 when published and a cancel was requested.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('XADD', KEYS[3], '*', 'e', ARGV[3])
redis.call('HINCRBY', KEYS[2], 'num_generated', tonumber(ARGV[4]))
if redis.call('HEXISTS', KEYS[2], 'first_token_ms') == 0 then
  redis.call('HSET', KEYS[2], 'first_token_ms', now_ms())
end
if redis.call('HGET', KEYS[2], 'cancel') == '1' then return 2 end
return 1
