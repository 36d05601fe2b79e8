-- fence (step 1 of 2, the request's slot): take a request away from a lease token
-- whose lease expired (mode 'reap') or that its worker hands back (mode 'release').
-- From here that worker's publish and finish write nothing. settle.lua then moves
-- the id on the model's slot from the state returned here.
-- A token that no longer holds the request is revoked all the same ('lease_gen'),
-- so a claim whose start.lua has not run yet can never start later.
-- KEYS[1] request hash   KEYS[2] stream
-- ARGV[1] id   ARGV[2] lease token   ARGV[3] 'reap' | 'release'   ARGV[4] max attempts
-- ARGV[5] ttl s   ARGV[6] lifecycle channel
-- Returns {state, finished ms or '', '1' when this call took it from the token else '0',
-- '1' when it goes back having published nothing else ''}:
-- 'queued' to put back in the queue, a terminal state ('cancelled', 'dead', ...) once
-- ended, 'running' when another worker holds it, 'missing' without a hash.
local h, stream, id = KEYS[1], KEYS[2], ARGV[1]
local state, holder, seen, cancel, attempts = unpack(redis.call('HMGET', h, 'state',
  'lease_token', 'lease_gen', 'cancel', 'attempts'))
if not state then return {'missing', '', '0'} end
if holder ~= ARGV[2] then
  local gen = token_gen(ARGV[2])
  if gen > tonumber(seen or '0') then redis.call('HSET', h, 'lease_gen', gen) end
  return {state, redis.call('HGET', h, 'finished_ms') or '', '0'}
end
redis.call('HDEL', h, 'lease_token')
local now = now_ms()
if ARGV[3] == 'release' then
  -- A hand-back is not a failure: the attempt it used is given back.
  redis.call('HINCRBY', h, 'attempts', -1)
elseif cancel == '1' then
  -- Cancelled while its worker was dying: end it rather than run it again.
  finalize(h, stream, id, 'cancelled', 'cancelled', cancelled_json(), now, ARGV[5], ARGV[6])
  return {'cancelled', tostring(now), '1'}
elseif tonumber(attempts or '0') >= tonumber(ARGV[4]) then
  local reason = 'worker lost ' .. attempts .. ' times (last: ' ..
    (redis.call('HGET', h, 'worker') or '?') .. '); attempts exhausted'
  local final = cjson.encode({type = 'final', finish_reason = 'error',
    usage = {prompt_tokens = 0, completion_tokens = tonumber(redis.call('HGET', h, 'num_generated') or '0')},
    error = reason})
  finalize(h, stream, id, 'dead', 'error', final, now, ARGV[5], ARGV[6])
  keep_dead(h, stream, reason)
  return {'dead', tostring(now), '1'}
end
redis.call('HSET', h, 'state', 'queued')
redis.call('HDEL', h, 'worker')
-- No reader is mid-answer on a request that published nothing: settle.lua puts it back
-- among new work, not in the room kept for resumed streams.
local published = tonumber(redis.call('HGET', h, 'num_generated') or '0')
return {'queued', '', '1', published == 0 and '1' or ''}
