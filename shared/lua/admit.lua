-- admit (enqueue, step 1 of 2, the request's slot): write the request hash before
-- its id is in any queue, so no worker can claim an id whose hash is not there yet.
-- enqueue.lua then puts the id in the model's queue. A crash between the two leaves
-- a hash no queue names (the submit was never acknowledged, so nothing accepted is
-- lost); a retry with the same idempotency key finds it 'queued' and enqueues it.
-- An idempotency key binds the body it came with (shared/idempotency.py): sent again
-- with another body, it is refused. A key written before bodies were kept has no
-- digest beside it, and answers whatever body comes with it, as it did then.
-- KEYS[1] request hash   KEYS[2] idempotency key (ignored when ARGV[3] == '')
-- KEYS[3] the key's body digest (ignored when ARGV[3] == '')
-- ARGV[1] request id   ARGV[2] payload json   ARGV[3] '1' when an idempotency key is given
-- ARGV[4] idempotency ttl s   ARGV[5] model   ARGV[6] priority   ARGV[7] deadline ms or ''
-- ARGV[8] tenant (who submitted it) or ''   ARGV[9] the body's digest, or ''
-- Returns {'ok', id} | {'duplicate', existing id}
--   | {'idempotency_key_reused', existing id}: the key names a request with another body
local id = ARGV[1]
if ARGV[3] ~= '' then
  local existing = redis.call('GET', KEYS[2])
  if existing then
    local body = redis.call('GET', KEYS[3])
    if body and body ~= ARGV[9] then return {'idempotency_key_reused', existing} end
    return {'duplicate', existing}
  end
end
local fields = {'payload', ARGV[2], 'state', 'queued', 'model', ARGV[5], 'priority', ARGV[6],
  'attempts', 0, 'created_ms', now_ms(), 'num_generated', 0}
if ARGV[8] ~= '' then table.insert(fields, 'tenant'); table.insert(fields, ARGV[8]) end
if ARGV[7] ~= '' then table.insert(fields, 'deadline_ms'); table.insert(fields, ARGV[7]) end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[2], id, 'EX', ARGV[4])
  redis.call('SET', KEYS[3], ARGV[9], 'EX', ARGV[4])
end
return {'ok', id}
