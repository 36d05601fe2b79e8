-- retry: run a dead-lettered request again from the start, at the back of its band.
-- KEYS[1] dead-letter set   KEYS[2] queue   KEYS[3] seq counter   KEYS[4] request hash
-- KEYS[5] stream   KEYS[6] wakeup list
-- ARGV[1] id   ARGV[2] lifecycle channel
-- Returns 1 when requeued, 0 when the id is not in the dead-letter set.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local seq = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], queue_score(redis.call('HGET', KEYS[4], 'priority'), seq, false), ARGV[1])
redis.call('DEL', KEYS[5])
redis.call('HDEL', KEYS[4], 'worker', 'lease_token', 'final', 'output', 'finish_reason',
  'finished_ms', 'started_ms', 'first_token_ms', 'dead_reason', 'cancel')
redis.call('HSET', KEYS[4], 'state', 'queued', 'attempts', 0, 'num_generated', 0, 'seq', seq)
redis.call('PERSIST', KEYS[4])
wake(KEYS[6])
redis.call('PUBLISH', ARGV[2], cjson.encode({event = 'retried', id = ARGV[1]}))
return 1
