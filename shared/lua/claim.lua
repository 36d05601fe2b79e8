-- claim (step 1 of 2, the model's slot): take candidate requests off the queue and
-- lease them. The caller peeks candidates (ZRANGE); one another worker took first is
-- skipped, so claims never double-assign. start.lua then runs each on its own slot
-- and settle.lua drops the leases of those that may not start.
-- A worker claims only what it can serve: a request marked with a LoRA rank (enqueue.lua)
-- over the worker's largest rank stays queued for a worker that serves it. In place of
-- each candidate it leaves so, the claim takes the next request of the same kind
-- (resumed or new, so the caller's room for each still holds) that the worker can
-- serve, among at most ARGV[4] entries past the candidates. It looks in queue order, so
-- priority and fair order hold among what the worker can claim, and the look is
-- bounded, so a queue full of adapter requests costs a base-only worker a short look
-- per claim, never a spin over the whole queue.
-- KEYS[1] queue   KEYS[2] leases (zset id -> expiry ms)   KEYS[3] owners (hash id -> token)
-- KEYS[4] scores (hash id -> resumed queue score)   KEYS[5] seq counter
-- KEYS[6] fair clock   KEYS[7] fair tags (new work moves its band's clock; _lib.lua)
-- KEYS[8] LoRA ranks (zset id -> rank of the model's adapter requests)
-- ARGV[1] worker id   ARGV[2] lease ms   ARGV[3] the largest LoRA rank the worker serves
-- (0: none; '': any, without looking at ranks)   ARGV[4] entries past the candidates it
-- may look at   ARGV[5..] candidate ids
-- Returns a flat list: id, lease token for each leased request.
local max_rank = tonumber(ARGV[3])
local ID_PATTERN = '^' .. string.rep('[0-9a-f]', 8) .. '%-' .. string.rep('[0-9a-f]', 24) .. '$'

-- The marks of 'ids' in one lookup (false: none), none looked up for a worker that
-- serves any rank.
local function marks_of(ids)
  if not max_rank or #ids == 0 then return {} end
  return redis.call('ZMSCORE', KEYS[8], unpack(ids))
end

-- No mark: a base request, or one queued before requests were marked (rolling upgrade).
local function fits(mark)
  return not mark or tonumber(mark) <= max_rank
end

local function kind(score)
  if tonumber(score) >= FRESH_OFFSET then return 'new' end
  return 'resumed'
end

-- The candidates the worker can serve, and how many of each kind it left.
local candidates = {unpack(ARGV, 5)}
local marks = marks_of(candidates)
local picked, left = {}, {new = 0, resumed = 0}
for n, id in ipairs(candidates) do
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and fits(marks[n]) then
    table.insert(picked, id)
  elseif score then
    left[kind(score)] = left[kind(score)] + 1
  end
end

-- In place of those left, the next ones it can serve past the last candidate queued.
local function look_past(limit)
  local last = -1
  for _, id in ipairs(candidates) do
    last = math.max(last, redis.call('ZRANK', KEYS[1], id) or -1)
  end
  local past = redis.call('ZRANGE', KEYS[1], last + 1, last + limit, 'WITHSCORES')
  local ids = {}
  for j = 1, #past, 2 do table.insert(ids, past[j]) end
  local past_marks = marks_of(ids)
  for n, id in ipairs(ids) do
    local k = kind(past[2 * n])
    -- Anything not an id (written by hand) is the caller's to drop when it reaches the head.
    if left[k] > 0 and fits(past_marks[n]) and string.match(id, ID_PATTERN) then
      table.insert(picked, id)
      left[k] = left[k] - 1
      if left.new + left.resumed == 0 then return end
    end
  end
end

if left.new + left.resumed > 0 and tonumber(ARGV[4]) > 0 then look_past(tonumber(ARGV[4])) end

local expiry = now_ms() + tonumber(ARGV[2])
local out = {}
for _, id in ipairs(picked) do
  local score = redis.call('ZSCORE', KEYS[1], id)
  -- An id held under a lease is already someone's; its queue entry is a stale hint.
  if score and redis.call('ZREM', KEYS[1], id) == 1 and redis.call('HEXISTS', KEYS[3], id) == 0 then
    local token = ARGV[1] .. ':' .. redis.call('INCR', KEYS[5])
    score = tonumber(score)
    if score >= FRESH_OFFSET then
      score = score - FRESH_OFFSET
      fair_advance(KEYS[1], KEYS[6], KEYS[7], score)
    end
    redis.call('HSET', KEYS[3], id, token)
    redis.call('HSET', KEYS[4], id, score)
    redis.call('ZADD', KEYS[2], expiry, id)
    table.insert(out, id)
    table.insert(out, token)
  end
end
return out
