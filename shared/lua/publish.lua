-- publish: append token events, each fenced by its request's lease token (kept in
-- the request hash, so a token touches only its request's slot) and made idempotent
-- by its token index, so a pipeline retried after a lost connection never writes a
-- token twice. On Redis Cluster one call per request; on one Redis one per step.
-- KEYS[2i - 1], KEYS[2i]: request hash and stream of event i (i from 1)
-- ARGV[4i - 3 .. 4i]: lease token, event json, number of new tokens, index of the event's
-- first token
-- Returns one code per event: 0 lease lost (nothing written) | 1 published (or already
-- was) | 2 published and a cancel was requested | 3 gap: the stream holds fewer tokens
-- than the index (nothing written)
local function publish_one(h, stream, token, event, num_tokens, index)
  local holder, published, cancel = unpack(redis.call('HMGET', h, 'lease_token',
    'num_generated', 'cancel'))
  if holder ~= token then return 0 end
  published = tonumber(published or '0')
  if index > published then return 3 end
  if index == published then
    redis.call('XADD', stream, '*', 'e', event)
    redis.call('HINCRBY', h, 'num_generated', num_tokens)
    if published == 0 then redis.call('HSETNX', h, 'first_token_ms', now_ms()) end
  end
  if cancel == '1' then return 2 end
  return 1
end

local out = {}
for i = 1, #KEYS / 2 do
  local a = 4 * i - 3
  out[i] = publish_one(KEYS[2 * i - 1], KEYS[2 * i], ARGV[a], ARGV[a + 1],
    tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]))
end
return out
