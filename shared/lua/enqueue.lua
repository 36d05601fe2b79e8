-- enqueue (step 2 of 2, the model's slot): put an admitted request in its model's
-- queue. Idempotent: an id already queued or held by a worker is left as it is.
-- KEYS[1] queue (zset)   KEYS[2] seq counter   KEYS[3] wakeup list
-- KEYS[4] deadlines (zset id -> deadline ms)   KEYS[5] served marker (set by workers)
-- KEYS[6] owners   KEYS[7] fair clock   KEYS[8] fair tags (see _lib.lua)
-- KEYS[9] LoRA adapters registered for the model (hash)
-- KEYS[10] LoRA ranks (zset id -> rank of the model's adapter requests; see claim.lua)
-- ARGV[1] request id   ARGV[2] priority (0..MAX_PRIORITY)   ARGV[3] max queued
-- ARGV[4] deadline ms or ''   ARGV[5] model   ARGV[6] lifecycle channel
-- ARGV[7] '1' to refuse a model no worker has served recently, '0' to queue it anyway
-- ARGV[8] fair member '<priority>:<tenant>'   ARGV[9] the request's estimated cost (units)
-- ARGV[10] the request's LoRA adapter or ''
-- KEYS[11] load failure (why the model's last worker could not load it; see registry.py)
-- KEYS[12] structured outputs served (present while a live worker serves them)
-- ARGV[11] the mark of a request for structured outputs (claim.lua), or 0
-- KEYS[13] prefixes (hash id -> its prefix fingerprints; claim.lua)
-- ARGV[12] the request's prefix fingerprints, space-separated, shortest cut first, or ''
-- Within its priority band it sits at its tenant's virtual start time (fair order).
-- A request with an adapter is marked with the adapter's registered rank, so that only
-- a worker that serves adapters of that rank claims it; it waits while none does (no
-- refusal here: workers come and go).
-- Returns {'ok', id} | {'full', queued count} | {'unknown_model', ''} | {'unknown_lora', ''}
--   | {'unloadable', reason}: no worker serves the model and the last one could not load it
--   | {'no_capability', what}: it asks for structured outputs; no live worker serves them
-- On a refusal the caller removes the admitted hash (withdraw.lua).
local id = ARGV[1]
if redis.call('ZSCORE', KEYS[1], id) or redis.call('HEXISTS', KEYS[6], id) == 1 then
  return {'ok', id}
end
if redis.call('EXISTS', KEYS[5]) == 0 then
  local why = redis.call('GET', KEYS[11])
  if why then return {'unloadable', why} end
  if ARGV[7] == '1' then return {'unknown_model', ''} end
end
local adapter = ARGV[10] ~= '' and redis.call('HGET', KEYS[9], ARGV[10])
if ARGV[10] ~= '' and not adapter then return {'unknown_lora', ''} end
local guided_mark = tonumber(ARGV[11]) or 0
-- Served, but by no live worker that has a grammar backend (an unserved model queues).
if guided_mark > 0 and redis.call('EXISTS', KEYS[5]) == 1 and redis.call('EXISTS', KEYS[12]) == 0 then
  return {'no_capability', 'structured outputs'}
end
local queued = redis.call('ZCARD', KEYS[1])
if queued >= tonumber(ARGV[3]) then return {'full', queued} end
redis.call('INCR', KEYS[2])  -- counts submissions (the dashboard's 'enqueued')
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[4], ARGV[4], id) end
local start = fair_charge(KEYS[7], KEYS[8], ARGV[2], ARGV[8], ARGV[9])
if adapter or guided_mark > 0 then
  -- A record without a rank (registered before ranks were kept) counts as rank 1:
  -- any worker that serves adapters takes it.
  local rank = adapter and math.max(tonumber(cjson.decode(adapter)['rank']) or 0, 1) or 0
  redis.call('ZADD', KEYS[10], rank + guided_mark, id)
end
if ARGV[12] ~= '' then redis.call('HSET', KEYS[13], id, ARGV[12]) end
redis.call('ZADD', KEYS[1], queue_score(ARGV[2], start, false), id)
wake(KEYS[3])
redis.call('PUBLISH', ARGV[6], cjson.encode({event = 'queued', id = id, model = ARGV[5]}))
return {'ok', id}
