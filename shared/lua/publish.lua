-- publish: append one token event to a running request's stream, fenced by its lease
-- and made idempotent by the event's token index, so a pipeline retried after a lost
-- connection never writes a token twice.
-- KEYS[1] owners   KEYS[2] request hash   KEYS[3] stream
-- ARGV[1] id   ARGV[2] lease token   ARGV[3] event json   ARGV[4] number of new tokens
-- ARGV[5] index of the event's first token
-- Returns 0 lease lost (nothing written) | 1 published (or already was)
--       | 2 published and a cancel was requested
--       | 3 gap: the stream holds fewer tokens than the index (nothing written)
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
local published = tonumber(redis.call('HGET', KEYS[2], 'num_generated') or '0')
local index = tonumber(ARGV[5])
if index > published then return 3 end
if index == published then
  redis.call('XADD', KEYS[3], '*', 'e', ARGV[3])
  redis.call('HINCRBY', KEYS[2], 'num_generated', tonumber(ARGV[4]))
  if redis.call('HEXISTS', KEYS[2], 'first_token_ms') == 0 then
    redis.call('HSET', KEYS[2], 'first_token_ms', now_ms())
  end
end
if redis.call('HGET', KEYS[2], 'cancel') == '1' then return 2 end
return 1
