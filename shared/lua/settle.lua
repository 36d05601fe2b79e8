-- settle (step 2 of 2, the model's slot): move ids on the model's keys after a
-- one-slot step on their own slots (publish's final, fence, start, cancel, expire) said
-- what became of them. Fenced by the lease token in owners, and idempotent, so a
-- repeat after a crash changes nothing. Then charge tenants what finished requests used
-- beyond the estimate enqueue charged (shared/fairness.py), so a tenant's later work
-- waits for the service it took.
-- KEYS[1] leases   KEYS[2] owners   KEYS[3] scores   KEYS[4] queue   KEYS[5] wakeup list
-- KEYS[6] deadlines   KEYS[7] dead-letter set   KEYS[8] recent index   KEYS[9] failed index
-- KEYS[10] LoRA ranks (claim.lua)   KEYS[11] fair clock   KEYS[12] fair tags
-- KEYS[13] prefixes   KEYS[14] passes (claim.lua: dropped with an ended request)
-- ARGV[1] lifecycle channel   ARGV[2] n, the number of ids   then n quints
-- ARGV[5i - 2 .. 5i + 2]: id, lease token ('' for a request no worker held: a cancel or
-- expiry while queued), its state, finished ms or '', '1' when it published nothing
-- else ''   then charge triples: priority, fair member '<priority>:<tenant>', units
-- State 'missing' (no hash) drops it from the queue and deadlines.
-- State 'queued' with a token puts the id back ahead of new work (its resumed score), or,
-- when it published nothing, among new work at the place it had (no reader is mid-answer);
-- a terminal state drops it from the deadlines (and the queue, but for an id the token
-- leased: its claim took it off) and files it in history.
-- Its LoRA rank mark goes with it, except for a dead letter (a retry queues it again:
-- purging dead letters drops their marks); one put back keeps it.
-- Returns the number of ids moved.
local TERMINAL = {finished = true, failed = true, cancelled = true, expired = true, dead = true}
local HISTORY_MAX = 1000
local charges = 3 + 5 * tonumber(ARGV[2])

-- Each list gets one command at the end, for all the ids it holds.
local lists = {unleased = {}, requeue = {}, ended = {}, unqueued = {}, unmark = {}, recent = {},
  failed = {}, dead = {}}

local function add(name, ...)
  for _, x in ipairs({...}) do table.insert(lists[name], x) end
end

-- Which groups' tokens still hold their leases (one lookup for all), and their scores.
local held, groups = {}, {}
for a = 3, charges - 1, 5 do
  if ARGV[a + 1] ~= '' then
    table.insert(held, ARGV[a])
    table.insert(groups, a)
  end
end
local holds, resumed = {}, {}
if #held > 0 then
  local owners, scores = hmget_all(KEYS[2], held), hmget_all(KEYS[3], held)
  for n, a in ipairs(groups) do
    if owners[n] == ARGV[a + 1] then
      holds[a], resumed[a] = true, scores[n] or '0'
      add('unleased', ARGV[a])
    end
  end
end

local function move(a)
  local id, state, at_ms = ARGV[a], ARGV[a + 2], ARGV[a + 3]
  if state == 'queued' and holds[a] then
    local score = tonumber(resumed[a])
    if ARGV[a + 4] == '1' then score = score + FRESH_OFFSET end
    add('requeue', score, id)
    redis.call('PUBLISH', ARGV[1], cjson.encode({event = 'requeued', id = id}))
  elseif TERMINAL[state] then
    add('ended', id)
    -- An id leased under this token is off the queue, prefixes and passes already:
    -- claim.lua took it off them when it leased it, and nothing queues a leased id
    -- (enqueue.lua looks at owners; a requeue here drops the lease with it).
    if not holds[a] then add('unqueued', id) end
    if state ~= 'dead' then add('unmark', id) end
    if at_ms ~= '' then
      add('recent', at_ms, id)
      if state == 'failed' or state == 'dead' then add('failed', at_ms, id) end
      if state == 'dead' then add('dead', at_ms, id) end
    end
  elseif state == 'missing' then
    -- Its hash is gone (a withdrawn submit, an expired request): nothing will run it.
    add('ended', id)
    add('unqueued', id)
    add('unmark', id)
  end
end

local moved = 0
for a = 3, charges - 1, 5 do
  if ARGV[a + 1] == '' or holds[a] then
    move(a)
    moved = moved + 1
  end
end

local function history(name, key)
  if #lists[name] > 0 then
    call_chunked('ZADD', key, lists[name])
    redis.call('ZREMRANGEBYRANK', key, 0, -HISTORY_MAX - 1)
  end
end
if #lists.unleased > 0 then
  call_chunked('HDEL', KEYS[2], lists.unleased)
  call_chunked('HDEL', KEYS[3], lists.unleased)
  call_chunked('ZREM', KEYS[1], lists.unleased)
end
if #lists.requeue > 0 then
  call_chunked('ZADD', KEYS[4], lists.requeue)
  wake(KEYS[5])
end
if #lists.ended > 0 then call_chunked('ZREM', KEYS[6], lists.ended) end
if #lists.unqueued > 0 then
  call_chunked('ZREM', KEYS[4], lists.unqueued)
  call_chunked('HDEL', KEYS[13], lists.unqueued)
  call_chunked('HDEL', KEYS[14], lists.unqueued)
end
if #lists.unmark > 0 then call_chunked('ZREM', KEYS[10], lists.unmark) end
history('recent', KEYS[8])
history('failed', KEYS[9])
if #lists.dead > 0 then call_chunked('ZADD', KEYS[7], lists.dead) end
for a = charges, #ARGV, 3 do
  fair_charge(KEYS[11], KEYS[12], ARGV[a], ARGV[a + 1], ARGV[a + 2])
end
return moved
