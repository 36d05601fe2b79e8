-- cancel: remove a queued request at once, or flag a running one for its worker.
-- KEYS[1] queue   KEYS[2] request hash   KEYS[3] stream   KEYS[4] deadlines
-- KEYS[5] recent index   KEYS[6] failed index
-- ARGV[1] id   ARGV[2] ttl s   ARGV[3] lifecycle channel
-- Returns 'cancelled' | 'requested' (running: its worker stops it) | 'done' (already
-- ended) | 'missing'
local state = redis.call('HGET', KEYS[2], 'state')
if not state then return 'missing' end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HSET', KEYS[2], 'output', '{"text":"","token_ids":[]}')
  finalize(KEYS[2], KEYS[3], {KEYS[5], KEYS[6]}, ARGV[1], 'cancelled', CANCELLED_JSON, now_ms(), ARGV[2], ARGV[3])
  return 'cancelled'
end
if state == 'running' then
  redis.call('HSET', KEYS[2], 'cancel', '1')
  redis.call('PUBLISH', ARGV[3], cjson.encode({event = 'cancel_requested', id = ARGV[1]}))
  return 'requested'
end
return 'done'
