-- decide.lua: decide one request against every rule that applies to it, atomically.
--
-- First every check is evaluated; then, only if every enforcing check admits
-- the request (and this is not a dry run), every check that admitted it is
-- committed. A rejected request consumes nothing from any rule. Each key is
-- written with its TTL in the same command (SET ... PX, PEXPIRE right after
-- ZADD), so no key ever lives without expiry. Time is the server's (TIME).
--
-- KEYS[i]  state key of check i (all keys share one {hash tag}: one cluster slot)
-- ARGV[1]  "1" for a dry run (evaluate, write nothing), else "0"
-- ARGV[2 + 6*(i-1) ...]  for check i: algorithm code, limit, period (seconds),
--          burst, cost, enforce ("1" blocks the request, "0" is a shadow rule)
--          algorithm codes: f fixed window, l sliding window log,
--          c sliding window counter, t token bucket, b leaky bucket
-- Returns  {now_us, admitted, then for each check: allowed, remaining,
--          reset_after_us, retry_after_us, delay_us}
--
-- Windows are aligned to multiples of the period since the epoch. Buckets
-- are one number, the theoretical arrival time (GCRA) in microseconds. The
-- log is a sorted set of one entry per unit of cost, scored by its time.

local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now = now_s * 1000000 + tonumber(t[2])
local dry = ARGV[1] == '1'

local function px(us)
  local v = math.ceil(us / 1000)
  if v < 1 then return 1 end
  return v
end

-- The window of now, computed in whole seconds: now / period in microseconds
-- can round up across a boundary in double precision.
local function window(period)
  return math.floor(now_s / (period / 1000000))
end

local function clamp(v)
  if v < 0 then return 0 end
  return math.floor(v + 1e-9)
end

-- Each evaluator returns: allowed, remaining if committed, remaining now,
-- reset_after, retry_after, delay, commit (a function, called only on commit).

local function fixed_window(key, limit, period, burst, cost)
  local w = window(period)
  local count = 0
  local v = redis.call('GET', key)
  if v then
    local sw, sc = string.match(v, '^(%d+):(%d+)$')
    if tonumber(sw) == w then count = tonumber(sc) end
  end
  local reset_after = (w + 1) * period - now
  if count + cost <= limit then
    return true, limit - count - cost, limit - count, reset_after, 0, 0, function()
      redis.call('SET', key, string.format('%d:%d', w, count + cost), 'PX', px(reset_after))
    end
  end
  local retry = reset_after
  if cost > limit then retry = period end
  return false, clamp(limit - count), clamp(limit - count), reset_after, retry, 0, nil
end

-- A log member: the microsecond and a 3-digit sequence, one integer of 19
-- digits that Redis stores in 8 bytes (a string member would cost ~20). Past
-- 999 entries in one microsecond, a string keeps it unique.
local function member(stamp, seq)
  if seq < 1000 then return stamp .. string.format('%03d', seq) end
  return stamp .. ':' .. seq
end

local function sliding_window_log(key, limit, period, burst, cost)
  local floor = now - period
  local count = redis.call('ZCOUNT', key, '(' .. string.format('%d', floor), '+inf')
  local reset_after = 0
  if count + cost <= limit then
    -- Every unit of the request is logged at now, so it leaves the trailing
    -- interval exactly when the request does. Members stay distinct with a
    -- sequence number after the entries already logged at this microsecond
    -- (counted here, not at commit, so the same key twice in one call is
    -- logged once, as every other algorithm writes it once).
    local stamp = string.format('%d', now)
    local seq = redis.call('ZCOUNT', key, stamp, stamp)
    return true, limit - count - cost, limit - count, period, 0, 0, function()
      -- ZADD before the trim: Redis lets a script that has written go on past
      -- maxmemory, and ZREMRANGEBYSCORE is a write that OOM does not refuse.
      -- ZADD in chunks: unpack() of a huge table would overflow Lua's C stack.
      local args = {}
      for i = 0, cost - 1 do
        args[#args + 1] = stamp
        args[#args + 1] = member(stamp, seq + i)
        if #args >= 1000 or i == cost - 1 then
          redis.call('ZADD', key, unpack(args))
          args = {}
        end
      end
      redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', floor))
      -- The newest entry is now, unless the server's clock stepped back.
      local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      redis.call('PEXPIRE', key, px(tonumber(newest[2]) - now + period))
    end
  end
  if count > 0 then
    local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset_after = tonumber(newest[2]) + period - now
  end
  local retry = period
  if cost <= limit then
    -- The request fits once the (count + cost - limit) oldest live entries have expired.
    local nth = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', floor), '+inf',
      'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
    retry = tonumber(nth[2]) + period - now
  end
  return false, clamp(limit - count), clamp(limit - count), reset_after, retry, 0, nil
end

local function sliding_window_counter(key, limit, period, burst, cost)
  local w = window(period)
  local cur, prev = 0, 0
  local v = redis.call('GET', key)
  if v then
    local sw, sc, sp = string.match(v, '^(%d+):(%d+):(%d+)$')
    sw = tonumber(sw)
    if sw == w then
      cur, prev = tonumber(sc), tonumber(sp)
    elseif sw == w - 1 then
      prev = tonumber(sc)
    end
  end
  local elapsed = now - w * period
  local left = period - elapsed
  -- prev * left / period + cur + cost <= limit, compared without division.
  local weighted = prev * left / period
  local ttl = (w + 2) * period - now
  if prev * left + (cur + cost) * period <= limit * period then
    return true, clamp(limit - cur - cost - weighted), clamp(limit - cur - weighted), ttl, 0, 0,
      function()
        redis.call('SET', key, string.format('%d:%d:%d', w, cur + cost, prev), 'PX', px(ttl))
      end
  end
  local reset_after = ttl
  if cur == 0 then reset_after = left end
  local retry
  if cost > limit then
    retry = ttl
  elseif cur + cost <= limit then
    -- Wait until the previous window's weight has shrunk enough.
    retry = math.ceil(period - (limit - cur - cost) * period / prev) - elapsed
  else
    -- Wait into the next window, where this window's count becomes the weighted one.
    retry = left + math.max(0, math.ceil(period - (limit - cost) * period / cur))
  end
  return false, clamp(limit - cur - weighted), clamp(limit - cur - weighted), reset_after, retry, 0,
    nil
end

-- Durations here are counted in units of 1/limit microsecond, in which one
-- request's interval (period / limit) is the whole number period: the
-- arithmetic is exact, so a bucket with exactly cost tokens left admits the
-- request (floating point at the scale of now, where a double's step is 1/4
-- microsecond, could otherwise reject it, even from an empty bucket). The stored
-- arrival time is floored to a whole microsecond, which can only admit sooner.
local function bucket(key, limit, period, burst, cost, is_leaky)
  local tat = tonumber(redis.call('GET', key) or 0)
  local backlog = 0
  if tat > now then backlog = (tat - now) * limit end
  local tau = burst * period
  local new_backlog = backlog + cost * period
  local remaining_now = clamp((tau - backlog) / period)
  if new_backlog <= tau then
    local delay = 0
    if is_leaky then delay = backlog / limit end
    return true, clamp((tau - new_backlog) / period), remaining_now, new_backlog / limit, 0, delay,
      function()
        redis.call('SET', key, string.format('%d', now + math.floor(new_backlog / limit)), 'PX',
          px(new_backlog / limit))
      end
  end
  local retry = (new_backlog - tau) / limit
  if cost > burst then retry = period end
  return false, remaining_now, remaining_now, backlog / limit, retry, 0, nil
end

local function token_bucket(key, limit, period, burst, cost)
  return bucket(key, limit, period, burst, cost, false)
end

local function leaky_bucket(key, limit, period, burst, cost)
  return bucket(key, limit, period, burst, cost, true)
end

local evaluators = {
  f = fixed_window,
  l = sliding_window_log,
  c = sliding_window_counter,
  t = token_bucket,
  b = leaky_bucket,
}

local admitted = true
local results = {}
local commits = {}
for i = 1, #KEYS do
  local a = 2 + 6 * (i - 1)
  local limit = tonumber(ARGV[a + 1])
  local period = tonumber(ARGV[a + 2]) * 1000000
  local ok, rem_after, rem_now, reset_after, retry, delay, commit =
    evaluators[ARGV[a]](KEYS[i], limit, period, tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4]))
  if not ok and ARGV[a + 5] == '1' then admitted = false end
  results[i] = {ok, rem_after, rem_now, reset_after, retry, delay}
  commits[i] = commit
end

local commit = admitted and not dry
local reply = {now, admitted and 1 or 0}
for i = 1, #KEYS do
  local r = results[i]
  if commit and commits[i] then commits[i]() end
  local remaining = r[3]
  if commit and r[1] then remaining = r[2] end
  reply[#reply + 1] = r[1] and 1 or 0
  reply[#reply + 1] = remaining
  reply[#reply + 1] = math.ceil(r[4])
  reply[#reply + 1] = math.ceil(r[5])
  reply[#reply + 1] = math.ceil(r[6])
end
return reply
