-- claim (step 1 of 2, the model's slot): take the queue's heads off the queue and lease
-- them, as many as the worker has room for: resumed requests (put back mid-answer) up to
-- ARGV[5], new ones up to ARGV[6] in all; nothing while the queue is paused. start.lua
-- then runs each on its own slot and settle.lua drops the leases of those that may not
-- start. Entries that are not request ids (written by hand) are taken off the queue.
-- A worker claims only what it can serve: a request marked with a LoRA rank (enqueue.lua)
-- over the worker's largest rank stays queued for a worker that serves it. In place of
-- each head it leaves so, the claim takes the next request of the same kind (resumed or
-- new, so the worker's room for each still holds) that the worker can serve, among at
-- most ARGV[4] entries past the heads. It looks in queue order, so priority and fair
-- order hold among what the worker can claim, and the look is bounded, so a queue full
-- of adapter requests costs a base-only worker a short look per claim, never a spin over
-- the whole queue.
-- KEYS[1] queue   KEYS[2] leases (zset id -> expiry ms)   KEYS[3] owners (hash id -> token)
-- KEYS[4] scores (hash id -> resumed queue score)   KEYS[5] seq counter
-- KEYS[6] fair clock   KEYS[7] fair tags (new work moves its band's clock; _lib.lua)
-- KEYS[8] LoRA ranks (zset id -> rank of the model's adapter requests)
-- KEYS[9] paused flag (the queue is not claimed while it exists)
-- KEYS[10] prefixes (hash id -> fingerprints, shortest cut first; enqueue.lua)
-- KEYS[11] this worker's warm set (fingerprints in its prefix cache; warm.lua)
-- KEYS[12] passes (hash id -> '<claims>:<first ms>' passed over for a warm match)
-- KEYS[13..] the warm sets of the model's other live workers (warm.lua names them)
-- ARGV[1] worker id   ARGV[2] lease ms   ARGV[3] the largest LoRA rank the worker serves
-- (0: none; '': any, without looking at ranks)   ARGV[4] entries past the heads it may
-- look at   ARGV[5] room for resumed requests   ARGV[6] room for new ones (in all)
-- ARGV[7] '1' when the worker serves structured outputs, '0' when not
-- ARGV[8] the mark added for structured outputs (a request's mark: that plus its rank)
-- ARGV[9] affinity window: new requests of the highest waiting priority it may look at
-- for a warm match (0: off)   ARGV[10] claims a request may be passed over   ARGV[11] ms
-- Prefix affinity: among the first ARGV[9] new requests of the highest waiting priority
-- band (none of them critical), the worker takes first those whose longest fingerprint
-- it holds warm, in place of the new heads it would take otherwise. A request passed
-- over that way counts its passes; after ARGV[10] of them or ARGV[11] ms since the first
-- it is taken ahead of any warm match. A request that a peer holds warmer than this
-- worker (KEYS[13..]) is left to that peer within the same bound, even when that leaves
-- the worker's room unfilled: computing its prefix here would evict one this worker
-- serves. What the worker takes is added to its warm set at once. Resumed requests are
-- never passed over. With no warm match on any worker, cold requests still come with
-- their siblings; requests with no fingerprint (short prompts) keep queue order.
-- Returns {{id, lease token, '1' if taken for a warm match else '', ...} for each leased
-- request, {ids taken off as malformed}}.
local max_rank = tonumber(ARGV[3])
local serves_guided, GUIDED_MARK = ARGV[7] ~= '0', tonumber(ARGV[8]) or math.huge
local FIRST_PEER = 13  -- KEYS[13..]: peers' warm sets
local ID_PATTERN = '^' .. string.rep('[0-9a-f]', 8) .. '%-' .. string.rep('[0-9a-f]', 24) .. '$'

-- The marks of 'ids' in one lookup (false: none), none looked up for a worker that
-- serves any rank.
local function marks_of(ids)
  if not max_rank or #ids == 0 then return {} end
  return redis.call('ZMSCORE', KEYS[8], unpack(ids))
end

-- No mark: a base request, or one queued before requests were marked (rolling upgrade).
local function fits(mark)
  if not mark then return true end
  local rank = tonumber(mark)
  if rank >= GUIDED_MARK then
    if not serves_guided then return false end
    rank = rank - GUIDED_MARK
  end
  return rank <= max_rank
end

local function kind(score)
  if tonumber(score) >= FRESH_OFFSET then return 'new' end
  return 'resumed'
end

if redis.call('EXISTS', KEYS[9]) == 1 then return {{}, {}} end

local score_of = {}  -- id -> queue score, of every id read here

-- The heads: resumed ones up to the room kept for them, new ones up to the free room.
-- Returns them, the malformed entries (taken off the queue) and how many entries lead
-- the queue up to the last head read.
local function heads(room, free)
  local last = free > 0 and '+inf' or string.format('(%d', FRESH_OFFSET)
  local found = redis.call('ZRANGE', KEYS[1], '-inf', last, 'BYSCORE', 'LIMIT', 0, room,
    'WITHSCORES')
  local ids, malformed = {}, {}
  for j = 1, #found, 2 do
    local id, score = found[j], tonumber(found[j + 1])
    if not string.match(id, ID_PATTERN) then
      table.insert(malformed, id)
    elseif #ids < (score < FRESH_OFFSET and room or free) then
      table.insert(ids, id)
      score_of[id] = score
    end
  end
  if #malformed > 0 then redis.call('ZREM', KEYS[1], unpack(malformed)) end
  return ids, malformed, #found / 2 - #malformed
end

local candidates, malformed, num_read = heads(tonumber(ARGV[5]), tonumber(ARGV[6]))
if #candidates == 0 then return {{}, malformed} end
-- The candidates the worker can serve, and how many of each kind it left.
local marks = marks_of(candidates)
local picked, left = {}, {new = 0, resumed = 0}
for n, id in ipairs(candidates) do
  if fits(marks[n]) then
    table.insert(picked, id)
  else
    local k = kind(score_of[id])
    left[k] = left[k] + 1
  end
end

-- In place of those left, the next ones it can serve past the heads read (a prefix of
-- the queue: num_read entries).
local function look_past(limit)
  local past = redis.call('ZRANGE', KEYS[1], num_read, num_read + limit - 1, 'WITHSCORES')
  local ids = {}
  for j = 1, #past, 2 do table.insert(ids, past[j]) end
  local past_marks = marks_of(ids)
  for n, id in ipairs(ids) do
    local k = kind(past[2 * n])
    -- Anything not an id (written by hand) is dropped when it reaches the head.
    if left[k] > 0 and fits(past_marks[n]) and string.match(id, ID_PATTERN) then
      table.insert(picked, id)
      score_of[id] = tonumber(past[2 * n])
      left[k] = left[k] - 1
      if left.new + left.resumed == 0 then return end
    end
  end
end

if left.new + left.resumed > 0 and tonumber(ARGV[4]) > 0 then look_past(tonumber(ARGV[4])) end
if #picked == 0 then return {{}, malformed} end

-- The new requests of the window that the worker may claim: the highest waiting band's
-- first ARGV[9] entries, those it can serve ({} when that band is critical).
local function window_ids()
  local found = redis.call('ZRANGE', KEYS[1], FRESH_OFFSET, '+inf', 'BYSCORE', 'LIMIT', 0,
    tonumber(ARGV[9]), 'WITHSCORES')
  if #found == 0 then return {} end
  local band = math.floor((tonumber(found[2]) - FRESH_OFFSET) / SCORE_BAND)
  if band == 0 then return {} end  -- MAX_PRIORITY: critical work is never held back
  local ids = {}
  for j = 1, #found, 2 do
    local score = tonumber(found[j + 1])
    if math.floor((score - FRESH_OFFSET) / SCORE_BAND) ~= band then break end
    if string.match(found[j], ID_PATTERN) then
      table.insert(ids, found[j])
      score_of[found[j]] = score
    end
  end
  local marks, out = marks_of(ids), {}
  for n, id in ipairs(ids) do
    if fits(marks[n]) then table.insert(out, id) end
  end
  return out
end

-- The fingerprints of 'ids' (KEYS[10]) in one list, with the id each belongs to and its
-- rank (1: the shortest cut).
local function fingerprints_of(ids)
  local f = {fps = {}, owner = {}, rank = {}}
  for n, value in ipairs(hmget_all(KEYS[10], ids)) do
    if value then
      local k = 0
      for fp in string.gmatch(value, '%S+') do
        k = k + 1
        table.insert(f.fps, fp)
        table.insert(f.owner, ids[n])
        table.insert(f.rank, k)
      end
    end
  end
  return f
end

-- id -> how long a warm match it has in the warm sets KEYS[first..last] (the rank of its
-- longest fingerprint found in any of them).
local function warm_matches(f, first, last)
  local out = {}
  if #f.fps == 0 then return out end
  for key = first, last do
    for n, hit in ipairs(redis.call('SMISMEMBER', KEYS[key], unpack(f.fps))) do
      if hit == 1 then out[f.owner[n]] = math.max(out[f.owner[n]] or 0, f.rank[n]) end
    end
  end
  return out
end

-- The window's warm matches for this worker, longest first, then in queue order (a tie
-- with a peer counts as a match: both hold it); the requests that a peer holds warm with
-- a longer match than this worker's (id -> true), left to that peer; and the rest, cold
-- on every worker, in queue order but siblings together: each where the first request
-- of its shortest fingerprint stands, so that a claim takes few new prefixes and leaves
-- the others to its peers (what it takes is warm for it at once).
local function classify(window)
  local f = fingerprints_of(window)
  local mine, theirs = warm_matches(f, 11, 11), warm_matches(f, FIRST_PEER, #KEYS)
  local group_of, group_at = {}, {}  -- id -> its shortest fingerprint -> its first index
  for n, fp in ipairs(f.fps) do
    if f.rank[n] == 1 then group_of[f.owner[n]] = fp end
  end
  local warm, elsewhere, cold = {}, {}, {}
  for n, id in ipairs(window) do
    local k, j = mine[id] or 0, theirs[id] or 0
    if k > 0 and k >= j then
      table.insert(warm, {id = id, k = k, n = n})
    elseif j > k then
      elsewhere[id] = true
    else
      local group = group_of[id] or id
      group_at[group] = group_at[group] or n
      table.insert(cold, {id = id, k = group_at[group], n = n})
    end
  end
  table.sort(warm, function(a, b) return a.k > b.k or (a.k == b.k and a.n < b.n) end)
  table.sort(cold, function(a, b) return a.k < b.k or (a.k == b.k and a.n < b.n) end)
  return warm, elsewhere, cold
end

-- Whether a request passed over has had its share: ARGV[10] passes or ARGV[11] ms.
local function due(pass, now)
  if not pass then return false end
  local count, first = string.match(pass, '^(%d+):(%d+)$')
  return tonumber(count) >= tonumber(ARGV[10]) or now - tonumber(first) >= tonumber(ARGV[11])
end

-- The order to take new work in: the window's due requests, then this worker's warm
-- matches, then the window's cold ones (classify), then the plain picks past the window
-- (a lower priority), unless one of the window's is left to a peer: then those wait, so
-- that priority is never crossed. With nothing warm anywhere, cold siblings still come
-- together, so that workers starting cold split the prefixes between them (each claim's
-- warm_up tells the next claim whose they are, whether or not the claimer has learnt of
-- its peers yet) instead of each computing every prefix its look-ahead reaches.
local function affinity_order(window, plain, now)
  local warm, elsewhere, cold = classify(window)
  local order, is_due, in_window, held, theirs = {}, {}, {}, false, {}
  -- Due ones a peer holds warm come after the other due ones: that peer may claim them.
  for n, pass in ipairs(hmget_all(KEYS[12], window)) do
    if due(pass, now) then
      table.insert(elsewhere[window[n]] and theirs or order, window[n])
      is_due[window[n]] = true
    end
  end
  for _, id in ipairs(theirs) do table.insert(order, id) end
  for _, w in ipairs(warm) do table.insert(order, w.id) end
  for _, c in ipairs(cold) do table.insert(order, c.id) end
  for _, id in ipairs(window) do
    in_window[id] = true
    if elsewhere[id] and not is_due[id] then held = true end
  end
  for _, id in ipairs(plain) do
    if not in_window[id] and not held then table.insert(order, id) end
  end
  return order, in_window
end

local by_affinity = {}  -- id -> true: taken for a warm match where the plain claim would not
-- Affinity has nothing to go on while no queued request has a fingerprint (short plain
-- prompts) and none has been passed over: then the claim is the plain one, without
-- reading the window, and there is nothing to warm up or clear. Two O(1) reads instead
-- of the window's.
local traced = tonumber(ARGV[9]) > 0
  and (redis.call('HLEN', KEYS[10]) > 0 or redis.call('HLEN', KEYS[12]) > 0)

-- Reorder the new picks by affinity_order, as many as the plain claim took at most (fewer
-- when what is left is a peer's). Those the plain claim would have taken and this one
-- leaves count a pass.
local function prefer_warm()
  local plain, resumed = {}, {}
  for _, id in ipairs(picked) do
    table.insert(score_of[id] >= FRESH_OFFSET and plain or resumed, id)
  end
  if #plain == 0 or not traced then return end
  local window = window_ids()
  if #window == 0 then return end
  local now = now_ms()
  local order, in_window = affinity_order(window, plain, now)
  local chosen, was_plain = {}, {}
  for _, id in ipairs(plain) do was_plain[id] = true end
  picked = {unpack(resumed)}
  for _, id in ipairs(order) do
    if #picked - #resumed >= #plain then break end
    if not chosen[id] then
      chosen[id] = true
      table.insert(picked, id)
      if not was_plain[id] then by_affinity[id] = true end
    end
  end
  for _, id in ipairs(plain) do
    if not chosen[id] and in_window[id] then
      local pass = redis.call('HGET', KEYS[12], id)
      local count, first = string.match(pass or '', '^(%d+):(%d+)$')
      redis.call('HSET', KEYS[12], id, (tonumber(count) or 0) + 1 .. ':' .. (first or now))
    end
  end
end

-- What this worker takes it will hold warm once computed: its warm set says so at once,
-- rather than at its next heartbeat after the prefill, so that a peer's next claim leaves
-- the request's siblings to it instead of computing the same prefix too. A set that the
-- heartbeat has not written yet expires with a lease.
local function warm_up(ids)
  local fps = fingerprints_of(ids).fps
  if #fps == 0 then return end
  call_chunked('SADD', KEYS[11], fps)
  if redis.call('PTTL', KEYS[11]) < 0 then redis.call('PEXPIRE', KEYS[11], ARGV[2]) end
end

prefer_warm()
if #picked == 0 then return {{}, malformed} end
if traced then warm_up(picked) end

-- Lease what is picked, in one command per key. An id held under a lease is already
-- someone's: its queue entry is a stale hint, dropped without a lease.
call_chunked('ZREM', KEYS[1], picked)
if traced or tonumber(ARGV[9]) <= 0 then
  call_chunked('HDEL', KEYS[10], picked)
  call_chunked('HDEL', KEYS[12], picked)
end
local owners = hmget_all(KEYS[3], picked)
local leased = {}
for n, id in ipairs(picked) do
  if not owners[n] then table.insert(leased, id) end
end
if #leased == 0 then return {{}, malformed} end
local gen = redis.call('INCRBY', KEYS[5], #leased) - #leased
local expiry = now_ms() + tonumber(ARGV[2])
local out, tokens, scores, expiries, band_last = {}, {}, {}, {}, {}
for n, id in ipairs(leased) do
  local token, score = ARGV[1] .. ':' .. (gen + n), score_of[id]
  if score >= FRESH_OFFSET then
    score = score - FRESH_OFFSET
    local band = score - score % SCORE_BAND
    band_last[band] = math.max(band_last[band] or 0, score)
  end
  table.insert(tokens, id)
  table.insert(tokens, token)
  table.insert(scores, id)
  table.insert(scores, score)
  table.insert(expiries, expiry)
  table.insert(expiries, id)
  table.insert(out, id)
  table.insert(out, token)
  table.insert(out, by_affinity[id] and '1' or '')
end
-- New work moves its band's clock to the latest start claimed in it (_lib.lua).
for _, score in pairs(band_last) do fair_advance(KEYS[1], KEYS[6], KEYS[7], score) end
call_chunked('HSET', KEYS[3], tokens)
call_chunked('HSET', KEYS[4], scores)
call_chunked('ZADD', KEYS[2], expiries)
return {out, malformed}
