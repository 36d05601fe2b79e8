-- finish (step 1 of 2, the request's slot): end a running request with its final
-- event and output, fenced by its lease token. settle.lua then drops its lease and
-- files it in the model's indexes; if that never runs, the lease expires and the
-- reaper settles it from the state written here.
-- KEYS[1] request hash   KEYS[2] stream
-- ARGV[1] id   ARGV[2] lease token   ARGV[3] final event json (timings are filled here)
-- ARGV[4] output json {text, token_ids}   ARGV[5] terminal state ('dead' dead-letters it)
-- ARGV[6] ttl s   ARGV[7] lifecycle channel
-- Returns 0 when the lease is lost (nothing written), else {final event json, state,
-- finished ms}.
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'output', ARGV[4])
local now = now_ms()
local final = finalize(KEYS[1], KEYS[2], ARGV[1], ARGV[5], ARGV[3], now, ARGV[6], ARGV[7])
if ARGV[5] == 'dead' then keep_dead(KEYS[1], KEYS[2], cjson.decode(final)['error'] or '') end
return {final, ARGV[5], tostring(now)}
