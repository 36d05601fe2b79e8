-- ratelimit (the bucket's slot): admit one request against an API key's limits, or
-- say which limit refuses it and for how long. Requests and tokens per minute are
-- GCRA (a virtual "theoretical arrival time" per limit, a burst of up to a minute's
-- worth allowed); concurrent requests are the bucket's in-flight set. All limits are
-- checked before any is charged, so a refusal costs nothing.
-- KEYS[1] requests TAT   KEYS[2] tokens TAT   KEYS[3] in-flight zset (member -> ms)
-- ARGV[1] requests per minute (0: none)   ARGV[2] tokens per minute (0: none)
-- ARGV[3] max concurrent (0: none)   ARGV[4] the request's tokens   ARGV[5] member to
-- hold its in-flight place   ARGV[6] in-flight entries older than this many ms lapse
-- Returns {verdict, retry ms, req limit, req remaining, req reset ms, tok limit,
--          tok remaining, tok reset ms, in flight}
--   verdict 'ok' | 'requests' | 'tokens' | 'concurrent' | 'too_large' (more tokens than
--   a minute allows: never admitted)
local WINDOW = 60000
local now = now_ms()
local rpm, tpm, max_conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[4])

-- {new TAT, ms over the window (> 0: refused), TAT now, interval} for 'n' of 'limit'.
local function gcra(key, limit, n)
  if limit <= 0 then return nil end
  local interval = WINDOW / limit
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now)
  local new = tat + n * interval
  return {new, new - now - WINDOW, tat, interval}
end

-- {limit, remaining, ms until the limit is whole again}, after this request if admitted.
local function figures(g, limit, admitted)
  if not g then return {0, 0, 0} end
  local ahead = (admitted and g[1] or g[3]) - now
  return {limit, math.max(0, math.floor((WINDOW - ahead) / g[4])), math.ceil(ahead)}
end

redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[6]))
local in_flight = redis.call('ZCARD', KEYS[3])
local req, tok = gcra(KEYS[1], rpm, 1), gcra(KEYS[2], tpm, cost)
local verdict, retry = 'ok', 0
if tpm > 0 and cost > tpm then
  verdict = 'too_large'
else
  -- The wait is the longest of the limits that refuse, so one retry after it fits.
  if req and req[2] > 0 then verdict, retry = 'requests', req[2] end
  if tok and tok[2] > 0 then
    if verdict == 'ok' then verdict = 'tokens' end
    retry = math.max(retry, tok[2])
  end
  if verdict == 'ok' and max_conc > 0 and in_flight >= max_conc then
    verdict, retry = 'concurrent', 1000
  end
end
local admitted = verdict == 'ok'
if admitted then
  if req then redis.call('SET', KEYS[1], req[1], 'PX', WINDOW * 2) end
  if tok then redis.call('SET', KEYS[2], tok[1], 'PX', WINDOW * 2) end
  if max_conc > 0 then
    redis.call('ZADD', KEYS[3], now, ARGV[5])
    redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[6]))
    in_flight = in_flight + 1
  end
end
local r, t = figures(req, rpm, admitted), figures(tok, tpm, admitted)
return {verdict, math.ceil(retry), r[1], r[2], r[3], t[1], t[2], t[3], in_flight}
