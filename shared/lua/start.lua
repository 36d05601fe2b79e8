-- start (claim, step 2 of 2, the request's slot): mark a leased request running
-- under its lease token, if its hash still says 'queued' and no newer or revoked
-- lease generation has been seen (see _lib.lua). One call per request.
-- KEYS[1] request hash   KEYS[2] stream
-- ARGV[1] id   ARGV[2] lease token   ARGV[3] worker id   ARGV[4] result ttl s
-- ARGV[5] lifecycle channel
-- Returns {'started', payload, attempts, num_generated}
--       | {state, finished ms or ''}: not started; settle.lua drops the lease. State is
--         'expired' when its deadline had passed (ended here), 'missing' without a hash.
local h = KEYS[1]
local state, seen, deadline = unpack(redis.call('HMGET', h, 'state', 'lease_gen', 'deadline_ms'))
if not state then return {'missing', ''} end
local gen = token_gen(ARGV[2])
if state ~= 'queued' or gen <= tonumber(seen or '0') then
  return {state, redis.call('HGET', h, 'finished_ms') or ''}
end
local now = now_ms()
if deadline and tonumber(deadline) <= now then
  finalize(h, KEYS[2], ARGV[1], 'expired', expired_json(), now, ARGV[4], ARGV[5])
  return {'expired', tostring(now)}
end
local attempts = redis.call('HINCRBY', h, 'attempts', 1)
redis.call('HSET', h, 'state', 'running', 'worker', ARGV[3], 'lease_token', ARGV[2],
  'lease_gen', gen)
redis.call('HSETNX', h, 'started_ms', now)
redis.call('PUBLISH', ARGV[5], cjson.encode({event = 'started', id = ARGV[1], worker = ARGV[3]}))
local payload, generated = unpack(redis.call('HMGET', h, 'payload', 'num_generated'))
return {'started', payload or '', attempts, tonumber(generated or '0')}
