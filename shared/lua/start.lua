-- start (claim, step 2 of 2, the requests' own slots): mark leased requests running
-- under their lease tokens, each if its hash still says 'queued' and no newer or revoked
-- lease generation has been seen (see _lib.lua). One call for a claim's requests on one
-- Redis, one per slot on a Redis Cluster.
-- KEYS[2i - 1], KEYS[2i]: request hash and stream of request i (i from 1)
-- ARGV[1] worker id   ARGV[2] result ttl s   ARGV[3] lifecycle channel
-- ARGV[2i + 2], ARGV[2i + 3]: id and lease token of request i
-- Returns one reply per request: {'started', payload, attempts, num_generated,
--   created ms, now ms} (the last two: its queue wait, for a trace)
--   | {state, finished ms or ''}: not started; settle.lua drops the lease. State is
--     'expired' when its deadline had passed (ended here), 'missing' without a hash.
local worker, ttl_s, channel = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()

local function start_one(h, stream, id, token)
  local state, seen, deadline, finished, attempts, payload, generated, started, created = unpack(
    redis.call('HMGET', h, 'state', 'lease_gen', 'deadline_ms', 'finished_ms', 'attempts',
    'payload', 'num_generated', 'started_ms', 'created_ms'))
  if not state then return {'missing', ''} end
  local gen = token_gen(token)
  if state ~= 'queued' or gen <= tonumber(seen or '0') then return {state, finished or ''} end
  if deadline and tonumber(deadline) <= now then
    finalize(h, stream, id, 'expired', 'expired', expired_json(), now, ttl_s, channel)
    return {'expired', tostring(now)}
  end
  attempts = tonumber(attempts or '0') + 1
  -- A request resumed after its worker died keeps its first start.
  redis.call('HSET', h, 'state', 'running', 'worker', worker, 'lease_token', token,
    'lease_gen', gen, 'attempts', attempts, 'started_ms', started or now)
  redis.call('PUBLISH', channel, cjson.encode({event = 'started', id = id, worker = worker}))
  return {'started', payload or '', attempts, tonumber(generated or '0'),
    tonumber(created or now), now}
end

local out = {}
for i = 1, #KEYS / 2 do
  out[i] = start_one(KEYS[2 * i - 1], KEYS[2 * i], ARGV[2 * i + 2], ARGV[2 * i + 3])
end
return out
