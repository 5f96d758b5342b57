-- decide.lua: decide one request against every rule that applies to it, atomically.
--
-- First every check is evaluated; then, only if every enforcing check admits
-- the request (and this is not a dry run), every check that admitted it is
-- committed. A rejected request consumes nothing from any rule. Each key is
-- written with its TTL in the same command (SET ... PX, PEXPIRE right after
-- ZADD), so no key ever lives without expiry. Time is the server's (TIME).
--
-- KEYS[i]  state key of check i, for i = 1..n; then, in the order of the checks, the
--          block key of each check whose block is not 0 (every key of one client
--          shares its {hash tag}: one cluster slot)
-- ARGV[1]  "1" for a dry run (evaluate, write nothing), else "0"
-- ARGV[2]  n, the number of checks
-- ARGV[3 + 7*(i-1) ...]  for check i: algorithm code, limit, period (seconds),
--          burst, cost, enforce ("1" blocks the request, "0" is a shadow rule),
--          block (seconds a rejection blocks the client for; 0: none)
--          algorithm codes: f fixed window, k calendar window (a fixed window of
--          weeks or months, whose burst is instead the starts of four consecutive
--          windows in epoch seconds, "s1:s2:s3:s4"), l sliding window log,
--          c sliding window counter, t token bucket, b leaky bucket,
--          n concurrency (the log's state: one entry per request in flight, a lease
--          of one period, removed by refund.lua when the request is finished)
-- Returns  {now_us, admitted, then for each check: allowed, remaining,
--          reset_after_us, retry_after_us, delay_us, blocked (1 while blocked)};
--          {now_us, -1} with nothing written when the server's time is in none of
--          a calendar check's windows (the caller's clock is off: it asks again with
--          windows around now_us)
--
-- A block is a key of its own with a TTL: while it lives the check rejects without
-- looking at its algorithm; a check that rejects starts one (even when the request
-- is rejected, and so commits nothing else). Every write waits until all checks
-- are evaluated.
--
-- Windows are aligned to multiples of the period since the epoch (calendar
-- windows: to the starts the caller computed in its time zone). Buckets
-- are one number, the theoretical arrival time (GCRA) in microseconds. The
-- log is a sorted set of one entry per admitted request, scored by its time.

local t = redis.call('TIME')
local now_s = tonumber(t[1])
local now = now_s * 1000000 + tonumber(t[2])
local dry = ARGV[1] == '1'

-- The script body runs at every call, so it is one flat loop: no table of
-- functions or per-check closures to build each time. Pending writes are kept
-- as data and made only once every enforcing check has admitted the request.

local function px(us)
  local v = math.ceil(us / 1000)
  if v < 1 then return 1 end
  return v
end

local function clamp(v)
  if v < 0 then return 0 end
  return math.floor(v + 1e-9)
end

local n = tonumber(ARGV[2])
local nb = n  -- the last block key used
local admitted = true
local reply = {now, 1}
local set_value, set_px = {}, {}  -- a check's pending SET (every algorithm but the log)
local blocks = {}  -- pending blocks: key, milliseconds, key, milliseconds...
local log_stamp, log_seq = {}, {}  -- a log check's pending entries
local allowed_at, after_at = {}, {}  -- where a check's allowed flag and remaining sit in reply

for i = 1, n do
  local a = 3 + 7 * (i - 1)
  local code = ARGV[a]
  local limit = tonumber(ARGV[a + 1])
  local period_s = tonumber(ARGV[a + 2])
  local period = period_s * 1000000
  local burst = tonumber(ARGV[a + 3])
  local cost = tonumber(ARGV[a + 4])
  local key = KEYS[i]
  -- allowed, remaining if committed, remaining now, reset_after, retry_after, delay
  local ok, rem_after, rem_now, reset_after, retry, delay = false, 0, 0, 0, 0, 0
  local block_ms = tonumber(ARGV[a + 6]) * 1000
  local bkey, blocked = nil, false
  if block_ms > 0 then
    nb = nb + 1
    bkey = KEYS[nb]
    local left = redis.call('PTTL', bkey)
    if left > 0 then
      blocked, retry, reset_after = true, left * 1000, left * 1000
    end
  end

  if blocked then
    -- Rejected until the block ends, whatever the algorithm's state.
  elseif code == 'f' or code == 'k' then
    -- Fixed window: "window:count", the window being its number since the epoch
    -- or, for a calendar window, its start. Windows are computed in whole seconds:
    -- now / period in microseconds can round up across a boundary in double precision.
    local w, starts, ends
    if code == 'f' then
      w = math.floor(now_s / period_s)
      starts, ends = w * period_s, (w + 1) * period_s
    else
      local s1, s2, s3, s4 = string.match(ARGV[a + 3], '^(%d+):(%d+):(%d+):(%d+)$')
      s1, s2, s3, s4 = tonumber(s1), tonumber(s2), tonumber(s3), tonumber(s4)
      if now_s < s1 or now_s >= s4 then return {now, -1} end
      if now_s < s2 then
        starts, ends = s1, s2
      elseif now_s < s3 then
        starts, ends = s2, s3
      else
        starts, ends = s3, s4
      end
      w = starts
    end
    local count = 0
    local v = redis.call('GET', key)
    if v then
      local sw, sc = string.match(v, '^(%d+):(%d+)$')
      if tonumber(sw) == w then count = tonumber(sc) end
    end
    reset_after = ends * 1000000 - now
    rem_now = clamp(limit - count)
    if count + cost <= limit then
      ok, rem_after = true, limit - count - cost
      set_value[i] = string.format('%d:%d', w, count + cost)
      set_px[i] = px(reset_after)
    else
      rem_after = rem_now
      retry = reset_after
      if cost > limit then retry = (ends - starts) * 1000000 end
    end

  elseif code == 'c' then
    -- Sliding window counter: "window:current:previous".
    local w = math.floor(now_s / period_s)
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
    local weighted = prev * left / period
    local ttl = (w + 2) * period - now
    rem_now = clamp(limit - cur - weighted)
    -- prev * left / period + cur + cost <= limit, compared without division.
    if prev * left + (cur + cost) * period <= limit * period then
      ok, rem_after, reset_after = true, clamp(limit - cur - cost - weighted), ttl
      set_value[i] = string.format('%d:%d:%d', w, cur + cost, prev)
      set_px[i] = px(ttl)
    else
      rem_after = rem_now
      reset_after = ttl
      if cur == 0 then reset_after = left end
      if cost > limit then
        retry = ttl
      elseif cur + cost <= limit then
        -- Wait until the previous window's weight has shrunk enough.
        retry = math.ceil(period - (limit - cur - cost) * period / prev) - elapsed
      else
        -- Wait into the next window, where this window's count becomes the weighted one.
        retry = left + math.max(0, math.ceil(period - (limit - cost) * period / cur))
      end
    end

  elseif code == 'l' or code == 'n' then
    -- Sliding window log: a sorted set of the admitted requests, scored by time. A
    -- request of cost 1 is a member ("<microsecond><3-digit sequence>"); one of cost c
    -- is one member too, suffixed "x<c>", whose c - 1 extra units are kept in the
    -- tally member "#" (score minus the extra units of the set), so a costly request
    -- is one entry, not c. Concurrency: the same set, whose entries are leases ended
    -- early by a refund.
    local floor = now - period
    local floor_s = string.format('%d', floor)
    local extra = -tonumber(redis.call('ZSCORE', key, '#') or 0)
    if extra > 0 then
      -- Costly entries that expired give their extra units back. This housekeeping
      -- changes nothing a decision can see, so it is done even when nothing else is.
      local dead = redis.call('ZRANGEBYSCORE', key, '(0', floor_s)
      if #dead > 0 then
        for _, m in ipairs(dead) do
          local c = string.match(m, 'x(%d+)$')
          if c then extra = extra - (tonumber(c) - 1) end
        end
        redis.call('ZREMRANGEBYSCORE', key, '(0', floor_s)
        if extra > 0 then
          redis.call('ZADD', key, -extra, '#')
        else
          extra = 0
          redis.call('ZREM', key, '#')
        end
      end
    end
    local count = redis.call('ZCOUNT', key, '(' .. floor_s, '+inf') + extra
    rem_now = clamp(limit - count)
    if count + cost <= limit then
      ok, rem_after, reset_after = true, limit - count - cost, period
      -- Logged at now, so it leaves the trailing interval exactly when the request
      -- does. Members stay distinct with a sequence number after the entries already
      -- logged at this microsecond (counted here, not at commit, so the same key twice
      -- in one call is logged once, as other algorithms write once).
      local stamp = string.format('%d', now)
      log_stamp[i] = stamp
      log_seq[i] = redis.call('ZCOUNT', key, stamp, stamp)
    else
      rem_after = rem_now
      if count > 0 then
        local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        reset_after = tonumber(newest[2]) + period - now
      end
      retry = period
      if cost <= limit then
        -- The request fits once the (count + cost - limit) oldest live units expire.
        local need = count + cost - limit
        if extra == 0 then
          local nth = redis.call('ZRANGEBYSCORE', key, '(' .. floor_s, '+inf',
            'WITHSCORES', 'LIMIT', need - 1, 1)
          retry = tonumber(nth[2]) + period - now
        else
          local offset = 0
          while need > 0 do
            local chunk = redis.call('ZRANGEBYSCORE', key, '(' .. floor_s, '+inf',
              'WITHSCORES', 'LIMIT', offset, 100)
            if #chunk == 0 then break end
            for j = 1, #chunk, 2 do
              need = need - tonumber(string.match(chunk[j], 'x(%d+)$') or 1)
              if need <= 0 then
                retry = tonumber(chunk[j + 1]) + period - now
                break
              end
            end
            offset = offset + 100
          end
        end
      end
      -- A lease usually ends long before it expires: ask again soon.
      if code == 'n' and retry > 1000000 then retry = 1000000 end
    end

  else
    -- Token bucket ('t') and leaky bucket ('b'): one number, the theoretical arrival
    -- time. Durations are counted in units of 1/limit microsecond, in which one
    -- request's interval (period / limit) is the whole number period: the arithmetic
    -- is exact, so a bucket with exactly cost tokens left admits the request
    -- (floating point at the scale of now, where a double's step is 1/4 microsecond,
    -- could otherwise reject it, even from an empty bucket). The stored arrival time
    -- is floored to a whole microsecond, which can only admit sooner.
    local tat = tonumber(redis.call('GET', key) or 0)
    local backlog = 0
    if tat > now then backlog = (tat - now) * limit end
    local tau = burst * period
    local new_backlog = backlog + cost * period
    rem_now = clamp((tau - backlog) / period)
    if new_backlog <= tau then
      ok, rem_after, reset_after = true, clamp((tau - new_backlog) / period), new_backlog / limit
      if code == 'b' then delay = backlog / limit end
      set_value[i] = string.format('%d', now + math.floor(new_backlog / limit))
      set_px[i] = px(new_backlog / limit)
    else
      rem_after = rem_now
      reset_after = backlog / limit
      retry = (new_backlog - tau) / limit
      if cost > burst then retry = period end
    end
  end

  if not ok and bkey and not blocked and not dry then
    blocks[#blocks + 1] = bkey
    blocks[#blocks + 1] = block_ms
    blocked = true
    if retry < block_ms * 1000 then retry = block_ms * 1000 end
    if reset_after < retry then reset_after = retry end
  end
  if not ok and ARGV[a + 5] == '1' then admitted = false end
  local r = #reply
  allowed_at[i], after_at[i] = ok, rem_after
  reply[r + 1] = ok and 1 or 0
  reply[r + 2] = rem_now
  reply[r + 3] = math.ceil(reset_after)
  reply[r + 4] = math.ceil(retry)
  reply[r + 5] = math.ceil(delay)
  reply[r + 6] = blocked and 1 or 0
end

for j = 1, #blocks, 2 do
  redis.call('SET', blocks[j], '1', 'PX', blocks[j + 1])
end
if not admitted then
  reply[2] = 0
elseif not dry then
  for i = 1, n do
    if allowed_at[i] then
      local key = KEYS[i]
      reply[2 + 6 * (i - 1) + 2] = after_at[i]  -- committed: report what remains after it
      if set_value[i] then
        redis.call('SET', key, set_value[i], 'PX', set_px[i])
      else
        local a = 3 + 7 * (i - 1)
        local period = tonumber(ARGV[a + 2]) * 1000000
        local cost = tonumber(ARGV[a + 4])
        local stamp, seq = log_stamp[i], log_seq[i]
        -- ZADD before the trim: Redis lets a script that has written go on past
        -- maxmemory, and ZREMRANGEBYSCORE is a write that OOM does not refuse. A
        -- member is the microsecond and a 3-digit sequence: one integer of 19 digits
        -- that Redis stores in 8 bytes (a string would cost ~20); past 999 entries in
        -- one microsecond, a string keeps it unique.
        local member = stamp .. string.format('%03d', seq)
        if seq >= 1000 then member = stamp .. ':' .. seq end
        if cost > 1 then
          redis.call('ZADD', key, stamp, member .. 'x' .. cost)
          redis.call('ZINCRBY', key, 1 - cost, '#')
        else
          redis.call('ZADD', key, stamp, member)
        end
        redis.call('ZREMRANGEBYSCORE', key, '(0', string.format('%d', now - period))
        -- The newest entry is now, unless the server's clock stepped back.
        local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        redis.call('PEXPIRE', key, px(tonumber(newest[2]) - now + period))
      end
    end
  end
end
return reply
