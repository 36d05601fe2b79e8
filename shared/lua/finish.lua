-- finish: end a running request with its final event and output, fenced by its lease.
-- KEYS[1] owners   KEYS[2] leases   KEYS[3] request hash   KEYS[4] stream
-- KEYS[5] dead-letter set (zset id -> ms)   KEYS[6] deadlines
-- KEYS[7] recent index   KEYS[8] failed index
-- ARGV[1] id   ARGV[2] lease token   ARGV[3] final event json (timings are filled here)
-- ARGV[4] output json {text, token_ids}   ARGV[5] terminal state ('dead' dead-letters it)
-- ARGV[6] ttl s   ARGV[7] lifecycle channel
-- Returns 0 when the lease is lost (nothing written), else the final event as written.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('HSET', KEYS[3], 'output', ARGV[4])
local now = now_ms()
local final = finalize(KEYS[3], KEYS[4], {KEYS[7], KEYS[8]}, ARGV[1], ARGV[5], ARGV[3], now, ARGV[6], ARGV[7])
if ARGV[5] == 'dead' then
  redis.call('ZADD', KEYS[5], now, ARGV[1])
  redis.call('HSET', KEYS[3], 'dead_reason', cjson.decode(final)['error'] or '')
  redis.call('PERSIST', KEYS[3])
  redis.call('PERSIST', KEYS[4])
end
return final
