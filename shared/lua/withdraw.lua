-- withdraw (the request's slot): remove a request its queue refused (full, or a
-- model nobody serves), so that its idempotency key does not point at it.
-- KEYS[1] request hash   KEYS[2] idempotency key   KEYS[3] the key's body digest
-- ARGV[1] request id
-- Returns 1 when removed, 0 when it had already moved on (it ran: keep it).
if redis.call('HGET', KEYS[1], 'state') ~= 'queued' or redis.call('HEXISTS', KEYS[1], 'lease_gen') == 1 then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2], KEYS[3]) end
return 1
