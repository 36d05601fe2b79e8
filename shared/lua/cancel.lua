-- cancel (step 1 of 2, the request's slot): end a queued request at once, or flag a
-- running one for its worker. For 'cancelled', settle.lua then takes the id off the
-- queue; should that never run, the stale queue entry is dropped at claim
-- (start.lua refuses a request that is no longer 'queued').
-- KEYS[1] request hash   KEYS[2] stream
-- ARGV[1] id   ARGV[2] ttl s   ARGV[3] lifecycle channel
-- Returns {'cancelled', finished ms} | {'requested', ''} (running: its worker stops it)
--       | {'done', ''} (already ended) | {'missing', ''}
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {'missing', ''} end
if state == 'queued' then
  local now = now_ms()
  finalize(KEYS[1], KEYS[2], ARGV[1], 'cancelled', 'cancelled', cancelled_json(), now, ARGV[2],
    ARGV[3], {'output', '{"text":"","token_ids":[]}'})
  return {'cancelled', tostring(now)}
end
if state == 'running' then
  redis.call('HSET', KEYS[1], 'cancel', '1')
  redis.call('PUBLISH', ARGV[3], cjson.encode({event = 'cancel_requested', id = ARGV[1]}))
  return {'requested', ''}
end
return {'done', ''}
