-- enqueue: add a request to its model's queue.
-- KEYS[1] queue (zset)   KEYS[2] seq counter   KEYS[3] request hash
-- KEYS[4] idempotency key (string; ignored when ARGV[6] == '')   KEYS[5] wakeup list
-- KEYS[6] deadlines (zset id -> deadline ms)   KEYS[7] served marker (set by workers)
-- ARGV[1] request id   ARGV[2] payload json   ARGV[3] priority (0..ARGV[10])
-- ARGV[4] max queued   ARGV[5] idempotency ttl s   ARGV[6] idempotency key text or ''
-- ARGV[7] deadline ms or ''   ARGV[8] model   ARGV[9] lifecycle channel   ARGV[10] max priority
-- ARGV[11] '1' to refuse a model no worker has served recently, '0' to queue it anyway
-- ARGV[12] tenant (who submitted it) or ''
-- Returns {'ok', id} | {'duplicate', existing id} | {'full', queued count}
--       | {'unknown_model', ''}
--
-- Score: bands of 2^46 per priority (highest priority lowest score); within a band
-- new work sits in the upper half in arrival order and work put back after a
-- worker died in the lower half, so it goes first. Always an exact integer < 2^53.
local id = ARGV[1]
if ARGV[6] ~= '' then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {'duplicate', existing} end
end
if ARGV[11] == '1' and redis.call('EXISTS', KEYS[7]) == 0 then return {'unknown_model', ''} end
local queued = redis.call('ZCARD', KEYS[1])
if queued >= tonumber(ARGV[4]) then return {'full', queued} end
local seq = redis.call('INCR', KEYS[2])
local band = tonumber(ARGV[10]) - tonumber(ARGV[3])
local score = band * 70368744177664 + 35184372088832 + seq
local now = now_ms()
redis.call('HSET', KEYS[3], 'payload', ARGV[2], 'state', 'queued', 'model', ARGV[8],
  'priority', ARGV[3], 'seq', seq, 'attempts', 0, 'created_ms', now, 'num_generated', 0)
if ARGV[12] ~= '' then redis.call('HSET', KEYS[3], 'tenant', ARGV[12]) end
if ARGV[7] ~= '' then
  redis.call('HSET', KEYS[3], 'deadline_ms', ARGV[7])
  redis.call('ZADD', KEYS[6], ARGV[7], id)
end
redis.call('ZADD', KEYS[1], score, id)
if ARGV[6] ~= '' then redis.call('SET', KEYS[4], id, 'EX', ARGV[5]) end
redis.call('LPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], 0, 0)
redis.call('PUBLISH', ARGV[9], cjson.encode({event = 'queued', id = id, model = ARGV[8]}))
return {'ok', id}
