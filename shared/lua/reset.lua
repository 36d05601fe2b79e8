-- reset (retry, step 1 of 2, the request's slot): make a dead-lettered request new
-- again: no output, no attempts, an empty stream. retry.lua then queues it. Running
-- this twice (a retry repeated after a crash) is harmless: a reset request answers 1.
-- KEYS[1] request hash   KEYS[2] stream
-- Returns its priority when it is ready to queue ('queued'), '' when it is not dead.
local state, priority = unpack(redis.call('HMGET', KEYS[1], 'state', 'priority'))
if state == 'queued' then return priority or '0' end
if state ~= 'dead' then return '' end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[1], 'worker', 'lease_token', 'final', 'output', 'finish_reason',
  'finished_ms', 'started_ms', 'first_token_ms', 'dead_reason', 'cancel', 'ended_by')
redis.call('HSET', KEYS[1], 'state', 'queued', 'attempts', 0, 'num_generated', 0)
redis.call('PERSIST', KEYS[1])
return priority or '0'
