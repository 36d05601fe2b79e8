-- enqueue: add a request to its model's queue.
-- KEYS[1] queue (zset)   KEYS[2] seq counter   KEYS[3] request hash
-- KEYS[4] idempotency key (string; ignored when ARGV[6] == '')   KEYS[5] wakeup list
-- KEYS[6] deadlines (zset id -> deadline ms)   KEYS[7] served marker (set by workers)
-- ARGV[1] request id   ARGV[2] payload json   ARGV[3] priority (0..MAX_PRIORITY)
-- ARGV[4] max queued   ARGV[5] idempotency ttl s   ARGV[6] idempotency key text or ''
-- ARGV[7] deadline ms or ''   ARGV[8] model   ARGV[9] lifecycle channel
-- ARGV[10] '1' to refuse a model no worker has served recently, '0' to queue it anyway
-- ARGV[11] tenant (who submitted it) or ''
-- Returns {'ok', id} | {'duplicate', existing id} | {'full', queued count}
--       | {'unknown_model', ''}
-- The score is queue_score (see _lib.lua and shared/priority.py).
local id = ARGV[1]
if ARGV[6] ~= '' then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {'duplicate', existing} end
end
if ARGV[10] == '1' and redis.call('EXISTS', KEYS[7]) == 0 then return {'unknown_model', ''} end
local queued = redis.call('ZCARD', KEYS[1])
if queued >= tonumber(ARGV[4]) then return {'full', queued} end
local seq = redis.call('INCR', KEYS[2])
local score = queue_score(ARGV[3], seq, false)
local now = now_ms()
redis.call('HSET', KEYS[3], 'payload', ARGV[2], 'state', 'queued', 'model', ARGV[8],
  'priority', ARGV[3], 'seq', seq, 'attempts', 0, 'created_ms', now, 'num_generated', 0)
if ARGV[11] ~= '' then redis.call('HSET', KEYS[3], 'tenant', ARGV[11]) end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], 'deadline_ms', ARGV[7])
  redis.call('ZADD', KEYS[6], ARGV[7], id)
end
redis.call('ZADD', KEYS[1], score, id)
if ARGV[6] ~= '' then redis.call('SET', KEYS[4], id, 'EX', ARGV[5]) end
wake(KEYS[5])
redis.call('PUBLISH', ARGV[9], cjson.encode({event = 'queued', id = id, model = ARGV[8]}))
return {'ok', id}
