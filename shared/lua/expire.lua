-- expire (step 1 of 2, the request's slot): end a queued request whose deadline
-- passed before any worker ran it; settle.lua then takes it off the model's queue.
-- KEYS[1] request hash   KEYS[2] stream
-- ARGV[1] id   ARGV[2] ttl s   ARGV[3] lifecycle channel
-- Returns {'expired', finished ms} | {state, finished ms or ''} when it did not expire
-- here, 'missing' without a hash.
local state, deadline, finished = unpack(redis.call('HMGET', KEYS[1], 'state', 'deadline_ms',
  'finished_ms'))
if not state then return {'missing', ''} end
local now = now_ms()
if state ~= 'queued' or not deadline or tonumber(deadline) > now then
  return {state, finished or ''}
end
finalize(KEYS[1], KEYS[2], ARGV[1], 'expired', 'expired', expired_json(), now, ARGV[2], ARGV[3])
return {'expired', tostring(now)}
