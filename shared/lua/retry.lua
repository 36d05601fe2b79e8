-- retry (step 2 of 2, the model's slot): queue a dead-lettered request that
-- reset.lua made new, at the back of its band. Only the call that takes the id out
-- of the dead-letter set queues it.
-- KEYS[1] dead-letter set   KEYS[2] queue   KEYS[3] seq counter   KEYS[4] wakeup list
-- ARGV[1] id   ARGV[2] priority   ARGV[3] lifecycle channel
-- Returns 1 when requeued, 0 when the id is not in the dead-letter set.
-- The back of the band is one past its last new request's start tag (fair order gives
-- no arrival number to take).
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('INCR', KEYS[3])
local low = queue_score(ARGV[2], 0, false)
local last = redis.call('ZREVRANGEBYSCORE', KEYS[2], low + SCORE_BAND - 1, low, 'WITHSCORES',
  'LIMIT', 0, 1)
local score = last[2] and tonumber(last[2]) + 1 or low
redis.call('ZADD', KEYS[2], math.min(score, low + SCORE_BAND - 1), ARGV[1])
wake(KEYS[4])
redis.call('PUBLISH', ARGV[3], cjson.encode({event = 'retried', id = ARGV[1]}))
return 1
