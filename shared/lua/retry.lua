-- retry (step 2 of 2, the model's slot): queue a dead-lettered request that
-- reset.lua made new, at the back of its band. Only the call that takes the id out
-- of the dead-letter set queues it.
-- KEYS[1] dead-letter set   KEYS[2] queue   KEYS[3] seq counter   KEYS[4] wakeup list
-- ARGV[1] id   ARGV[2] priority   ARGV[3] lifecycle channel
-- Returns 1 when requeued, 0 when the id is not in the dead-letter set.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
local seq = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], queue_score(ARGV[2], seq, false), ARGV[1])
wake(KEYS[4])
redis.call('PUBLISH', ARGV[3], cjson.encode({event = 'retried', id = ARGV[1]}))
return 1
