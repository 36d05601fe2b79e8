-- claim: take candidate requests off the queue and mark them running under a lease.
-- The caller peeks candidates (ZRANGE) and passes their keys; a candidate another
-- worker took first is skipped, so claims never double-assign.
-- KEYS[1] queue   KEYS[2] leases (zset id -> expiry ms)   KEYS[3] owners (hash id -> token)
-- KEYS[4] deadlines   KEYS[5] recent index   KEYS[6] failed index
-- KEYS[7 + 2i], KEYS[8 + 2i]: request hash and stream of candidate i (i from 0)
-- ARGV[1] worker id   ARGV[2] lease ms   ARGV[3] result ttl s   ARGV[4] lifecycle channel
-- ARGV[5 + i] candidate id i
-- Returns a flat list: id, lease token, payload, attempts, num_generated for each claimed
-- request. Candidates whose deadline passed end as 'expired' without running.
local now = now_ms()
local out = {}
for i = 0, #ARGV - 5 do
  local id = ARGV[5 + i]
  local h, stream = KEYS[7 + 2 * i], KEYS[8 + 2 * i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local deadline = redis.call('HGET', h, 'deadline_ms')
    if deadline and tonumber(deadline) <= now then
      redis.call('ZREM', KEYS[4], id)
      finalize(h, stream, {KEYS[5], KEYS[6]}, id, 'expired', EXPIRED_JSON, now, ARGV[3], ARGV[4])
    else
      local attempts = redis.call('HINCRBY', h, 'attempts', 1)
      local token = ARGV[1] .. ':' .. now .. ':' .. attempts
      redis.call('HSET', h, 'state', 'running', 'worker', ARGV[1], 'lease_token', token)
      redis.call('HSETNX', h, 'started_ms', now)
      redis.call('HSET', KEYS[3], id, token)
      redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), id)
      redis.call('PUBLISH', ARGV[4], cjson.encode({event = 'started', id = id, worker = ARGV[1]}))
      local payload, generated = unpack(redis.call('HMGET', h, 'payload', 'num_generated'))
      table.insert(out, id)
      table.insert(out, token)
      table.insert(out, payload or '')
      table.insert(out, attempts)
      table.insert(out, tonumber(generated or '0'))
    end
  end
end
return out
