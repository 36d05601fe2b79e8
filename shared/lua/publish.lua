-- publish (the requests' own slots): a worker's write. For each request, its token event
-- and, when it ended, its final event and output: fenced by its lease token (kept in the
-- request hash, so a write touches only its requests' slots) and made idempotent by the
-- index of the event's first token, so a write retried after a lost connection never
-- writes a token twice. A final is written only when the stream then holds exactly the
-- tokens the worker counts, so a stream cut short (a failover lost its tail) never ends
-- with a gap; a final retried after it went through answers as the first time did.
-- settle.lua then files what ended on the model's slot. One call per write on one Redis,
-- one per slot on a Redis Cluster.
-- KEYS[2i - 1], KEYS[2i]: request hash and stream of request i (i from 1 to n)
-- ARGV[1] result ttl s   ARGV[2] lifecycle channel
-- ARGV[4i - 1 .. 4i + 2] for request i: lease token, token event json or '', number of
-- its tokens, index of its first token (with no event: the tokens the stream must hold
-- before its final; '' checks nothing)
-- then for each request that ended, ARGV[a .. a + 5]: i, request id, final event json
-- (without its timings: finalize adds them), output json, terminal state ('dead'
-- dead-letters it), finish reason
-- Returns n codes, then for each final written (code 4), in order: final event json
-- (timings filled in), state, finished ms.
-- code 0 lease lost (nothing written) | 1 published (or already was) | 2 published and a
-- cancel was requested | 3 gap: the stream holds fewer tokens than the index (nothing
-- written) | 4 finished (the final is written, now or by this write before)
local LEASE_LOST, PUBLISHED, CANCEL_REQUESTED, GAP, FINISHED = 0, 1, 2, 3, 4
local n = #KEYS / 2
local out, written, published = {}, {}, {}
-- Every command a script runs costs Redis about as much as the command itself, and the
-- calls per request add up on short answers: the hash is read once per request (with
-- what a final's timings need when it ends in this call), the clock once per call.
local ends, known = {}, {}  -- i -> true when request i ends here; its timings' fields
for f = 4 * n + 3, #ARGV, 6 do ends[tonumber(ARGV[f])] = true end
local TIMED = {'created_ms', 'started_ms'}
local now
local function clock()
  now = now or now_ms()
  return now
end

local function publish_one(i)
  local h, a = KEYS[2 * i - 1], 4 * i - 1
  local got = redis.call('HMGET', h, 'lease_token', 'num_generated', 'cancel', 'first_token_ms',
    unpack(ends[i] and TIMED or {}))
  local holder, count, cancel, first = got[1], got[2], got[3], got[4]
  if ends[i] then known[i] = {got[5], got[6], first} end
  if holder ~= ARGV[a] then return LEASE_LOST end
  count = tonumber(count or '0')
  published[i] = count
  if ARGV[a + 1] == '' then return PUBLISHED end
  local index, num_tokens = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 2])
  if index > count then return GAP end
  if index == count then
    redis.call('XADD', KEYS[2 * i], '*', 'e', ARGV[a + 1])
    if first then
      redis.call('HINCRBY', h, 'num_generated', num_tokens)
    else
      -- Its first tokens: the count and when they came, in one command.
      redis.call('HSET', h, 'num_generated', count + num_tokens, 'first_token_ms', clock())
      if known[i] then known[i][3] = tostring(clock()) end
    end
    published[i] = count + num_tokens
  end
  if cancel == '1' then return CANCEL_REQUESTED end
  return PUBLISHED
end

-- A final that went through already (its reply was lost): the same answer again.
local function finished_before(h, token)
  local ended_by, final, state, at = unpack(redis.call('HMGET', h, 'ended_by', 'final', 'state',
    'finished_ms'))
  if ended_by == token and final then return {final, state, at} end
  return nil
end

-- The final of request i (ARGV[f .. f + 5] its group): a reply {final, state, ms} or a code.
local function finish_one(i, f)
  local h, a = KEYS[2 * i - 1], 4 * i - 1
  if out[i] == LEASE_LOST then return finished_before(h, ARGV[a]) or LEASE_LOST end
  if out[i] == GAP then return GAP end
  local expected = ARGV[a + 3]
  if expected ~= '' and published[i] ~= tonumber(expected) + tonumber(ARGV[a + 2]) then
    return GAP
  end
  local at, state = clock(), ARGV[f + 4]
  local final = finalize(h, KEYS[2 * i], ARGV[f + 1], state, ARGV[f + 5], ARGV[f + 2], at,
    ARGV[1], ARGV[2], {'output', ARGV[f + 3], 'ended_by', ARGV[a]}, known[i])
  if state == 'dead' then keep_dead(h, KEYS[2 * i], cjson.decode(final)['error'] or '') end
  return {final, state, tostring(at)}
end

for i = 1, n do out[i] = publish_one(i) end
for f = 4 * n + 3, #ARGV, 6 do
  local i = tonumber(ARGV[f])
  local reply = finish_one(i, f)
  if type(reply) == 'table' then
    out[i] = FINISHED
    for _, x in ipairs(reply) do table.insert(written, x) end
  else
    out[i] = reply
  end
end
for _, x in ipairs(written) do table.insert(out, x) end
return out
