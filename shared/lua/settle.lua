-- settle (step 2 of 2, the model's slot): move ids on the model's keys after a
-- one-slot step on their own slots (finish, fence, start, cancel, expire) said
-- what became of them. Fenced by the lease token in owners, and idempotent, so a
-- repeat after a crash changes nothing.
-- KEYS[1] leases   KEYS[2] owners   KEYS[3] scores   KEYS[4] queue   KEYS[5] wakeup list
-- KEYS[6] deadlines   KEYS[7] dead-letter set   KEYS[8] recent index   KEYS[9] failed index
-- KEYS[10] LoRA ranks (claim.lua)
-- ARGV[1] lifecycle channel   then quints ARGV[5i - 3 .. 5i + 1]: id, lease token (''
-- for a request no worker held: a cancel or expiry while queued), its state, finished
-- ms or '', '1' when it published nothing else ''
-- State 'queued' with a token puts the id back ahead of new work (its resumed score), or,
-- when it published nothing, among new work at the place it had (no reader is mid-answer);
-- a terminal state drops it from the queue and deadlines and files it in history.
-- Its LoRA rank mark goes with it, except for a dead letter (a retry queues it again:
-- purging dead letters drops their marks); one put back keeps it.
-- Returns the number of ids moved.
local TERMINAL = {finished = true, failed = true, cancelled = true, expired = true, dead = true}
local HISTORY_MAX = 1000

local function remember(id, state, at_ms)
  redis.call('ZADD', KEYS[8], at_ms, id)
  redis.call('ZREMRANGEBYRANK', KEYS[8], 0, -HISTORY_MAX - 1)
  if state == 'failed' or state == 'dead' then
    redis.call('ZADD', KEYS[9], at_ms, id)
    redis.call('ZREMRANGEBYRANK', KEYS[9], 0, -HISTORY_MAX - 1)
  end
end

-- Drop a lease; returns its resumed queue score, or nil when the token no longer holds it.
local function unlease(id, token)
  if redis.call('HGET', KEYS[2], id) ~= token then return nil end
  local score = redis.call('HGET', KEYS[3], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[1], id)
  return score or '0'
end

local moved, woken = 0, false
for a = 2, #ARGV, 5 do
  local id, token, state, at_ms = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local score = nil
  if token ~= '' then score = unlease(id, token) end
  if token == '' or score then
    if state == 'queued' and score then
      if ARGV[a + 4] == '1' then score = tonumber(score) + FRESH_OFFSET end
      redis.call('ZADD', KEYS[4], score, id)
      redis.call('PUBLISH', ARGV[1], cjson.encode({event = 'requeued', id = id}))
      woken = true
    elseif TERMINAL[state] then
      redis.call('ZREM', KEYS[4], id)
      redis.call('ZREM', KEYS[6], id)
      if state ~= 'dead' then redis.call('ZREM', KEYS[10], id) end
      if at_ms ~= '' then
        remember(id, state, tonumber(at_ms))
        if state == 'dead' then redis.call('ZADD', KEYS[7], at_ms, id) end
      end
    elseif state == 'missing' then
      redis.call('ZREM', KEYS[10], id)  -- its hash is gone: nothing will run it
    end
    moved = moved + 1
  end
end
if woken then wake(KEYS[5]) end
return moved
