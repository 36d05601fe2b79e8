-- enqueue (step 2 of 2, the model's slot): put an admitted request in its model's
-- queue. Idempotent: an id already queued or held by a worker is left as it is.
-- KEYS[1] queue (zset)   KEYS[2] seq counter   KEYS[3] wakeup list
-- KEYS[4] deadlines (zset id -> deadline ms)   KEYS[5] served marker (set by workers)
-- KEYS[6] owners   KEYS[7] LoRA adapters registered for the model (hash)
-- ARGV[1] request id   ARGV[2] priority (0..MAX_PRIORITY)   ARGV[3] max queued
-- ARGV[4] deadline ms or ''   ARGV[5] model   ARGV[6] lifecycle channel
-- ARGV[7] '1' to refuse a model no worker has served recently, '0' to queue it anyway
-- ARGV[8] the request's LoRA adapter or ''
-- Returns {'ok', id} | {'full', queued count} | {'unknown_model', ''} | {'unknown_lora', ''}
-- On a refusal the caller removes the admitted hash (withdraw.lua).
local id = ARGV[1]
if redis.call('ZSCORE', KEYS[1], id) or redis.call('HEXISTS', KEYS[6], id) == 1 then
  return {'ok', id}
end
if ARGV[7] == '1' and redis.call('EXISTS', KEYS[5]) == 0 then return {'unknown_model', ''} end
if ARGV[8] ~= '' and redis.call('HEXISTS', KEYS[7], ARGV[8]) == 0 then
  return {'unknown_lora', ''}
end
local queued = redis.call('ZCARD', KEYS[1])
if queued >= tonumber(ARGV[3]) then return {'full', queued} end
local seq = redis.call('INCR', KEYS[2])
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[4], ARGV[4], id) end
redis.call('ZADD', KEYS[1], queue_score(ARGV[2], seq, false), id)
wake(KEYS[3])
redis.call('PUBLISH', ARGV[6], cjson.encode({event = 'queued', id = id, model = ARGV[5]}))
return {'ok', id}
