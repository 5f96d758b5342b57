-- decide.lua: decide one request against every rule that applies to it, atomically.
--
-- First every check is evaluated; then, only if every enforcing check admits
-- the request (and this is not a dry run), every check that admitted it is
-- committed. A rejected request consumes nothing from any rule. Each key is
-- written with its TTL in the same command (SET ... PX, PEXPIRE right after
-- ZADD), so no key ever lives without expiry. Time is the server's (TIME).
--
-- KEYS     for each check in order, its state key, then its block key (every key of one
--          client shares its {hash tag}: one cluster slot); the state key twice when the
--          block cannot be read (its slot migrating: the block neither read nor started)
-- ARGV     "dry" first for a dry run (evaluate, write nothing); then for each check:
--            code     algorithm: f fixed window, k calendar window (a fixed window of
--                     weeks or months), c sliding window counter, l sliding window log,
--                     t token bucket, b leaky bucket, n concurrency (the log's state: one
--                     entry per request in flight, a lease of one period, removed by
--                     refund.lua when the request is finished)
--            limit    negative for a shadow rule (its rejection never rejects the request)
--            period   seconds
--            cost
--            block    seconds a rejection blocks the client for ('0': the rule never
--                     starts a block; one written by block.lua still rejects)
--            burst    t and b only: the bucket size
--            s1 s2 s3 s4   k only: the starts of four consecutive windows, epoch seconds
-- Returns  {now_us, admitted, then for each check: state (1 allowed, 0 rejected,
--          2 rejected and blocked), remaining, reset_after_us, wait_us (allowed: the delay
--          before it may proceed, leaky bucket only; rejected: retry_after)};
--          {now_us, -1} with nothing written when the server's time is in none of a
--          calendar check's windows (the caller's clock is off: it asks again with
--          windows around now_us)
--
-- A block is a key of its own with a TTL: while it lives the check rejects without
-- looking at its algorithm, whatever the rule; a check of a rule with a block duration
-- that rejects starts one (even when the request is rejected, and so commits nothing
-- else), and block.lua writes one for any rule (block_key(), the dashboard's Block).
-- Every write waits until all checks are evaluated.
--
-- State, one key per rule and client, with a TTL:
--   fixed and calendar windows  "window:count", the window being its number since the
--          epoch or, for a calendar window, its start in epoch seconds
--   sliding window counter  this window's count, the previous one's and the window in
--          one integer of 16 digits, what Redis keeps in the fewest bytes (exact in a
--          double): d * 10^15 + (current * 10^d + previous) * m + window % m, where d
--          (1 to 5) is the number of digits of the larger count and m = 10^(15 - 2d).
--          The key ends with the next window, so a value found is this window's or the
--          previous one's (or, after the server's clock stepped back, another's): the
--          window modulo m, m at least 10^5, tells which. With a count of 6 digits or
--          more, "window:current:previous", the form every counter had before (read
--          in either form: nothing is lost on upgrade)
--   buckets  one integer, the theoretical arrival time (GCRA) in microseconds
--   log and concurrency  a sorted set of one entry per admitted request, scored by
--          its time (see below)
--
-- Windows are aligned to multiples of the period since the epoch (calendar
-- windows: to the starts the caller computed in its time zone).
--
-- Every call runs this whole body, so the hot path is written for Redis's Lua VM,
-- where each table, C function call and number formatted costs as much as a
-- dozen VM instructions: no table but the reply (and, with several checks, one of
-- pending writes); a string known to hold a number read by arithmetic (x + 0) rather
-- than tonumber; floor and ceil by x % 1 rather than math.floor and math.ceil; and a
-- number Redis can take as it is is given as a number (below 10^8 it reaches Redis
-- as the same digits on every version; from 10^8 on it is formatted here, as Redis
-- 7.2+ would send 1e+08, which PX refuses).

local call = redis.call
local t = call('TIME')
local now_s = t[1] + 0
local now = now_s * 1000000 + t[2]
local argv, keys = ARGV, KEYS
local dry = argv[1] == 'dry'
local a = dry and 2 or 1
local admitted = true
local i, k = 0, 0  -- the check, its state key
local code = argv[a]
-- The current check; after the loop, the only one when there is one: its reply is
-- built from these and its write made from them, with no table in between.
local key, ok, rem_now, rem_after, reset_after, wait, blocked
local value, px, period, cost, floor_s, trim, stamp
-- The sliding log's reads: at most STEP entries each, BATCHES reads of dead entries a call.
local STEP, BATCHES = 100, 5
local reply, pend, blocks  -- several checks only; blocks: only when one starts

while code do
  i, k = i + 1, k + 1
  key = keys[k]
  local limit = argv[a + 1] + 0
  local enforce = limit > 0
  if not enforce then limit = -limit end
  local period_s = argv[a + 2] + 0
  cost = argv[a + 3] + 0
  local block = argv[a + 4]
  local x = a + 5  -- the check's next argument
  k = k + 1
  local bkey = keys[k]
  ok, wait, blocked = false, 0, false
  -- The state key again: no block key (a slot migrating, see cluster.py's _redirected).
  local left = bkey ~= key and call('PTTL', bkey) or 0
  if left > 0 then
    blocked, rem_now, reset_after, wait = true, 0, left * 1000, left * 1000
  end

  if blocked then
    -- Rejected until the block ends, whatever the algorithm's state.
    if code == 't' or code == 'b' then
      a = x + 1
    elseif code == 'k' then
      a = x + 4
    else
      a = x
    end

  elseif code == 't' or code == 'b' then
    -- Token bucket ('t') and leaky bucket ('b'): one number, the theoretical arrival
    -- time. Durations are counted in units of 1/limit microsecond, in which one
    -- request's interval (period / limit) is the whole number period: the arithmetic
    -- is exact, so a bucket with exactly cost tokens left admits the request
    -- (floating point at the scale of now, where a double's step is 1/4 microsecond,
    -- could otherwise reject it, even from an empty bucket). The stored arrival time
    -- is floored to a whole microsecond, which can only admit sooner.
    local burst = argv[x] + 0
    a = x + 1
    period = period_s * 1000000
    local backlog = 0
    local v = call('GET', key)
    if v then
      v = v + 0
      if v > now then backlog = (v - now) * limit end
    end
    local tau = burst * period
    local after = backlog + cost * period
    local r = (tau - backlog) / period + 1e-9
    if after <= tau then
      -- Neither remainder can be below 0 here.
      ok, rem_now = true, r - r % 1
      r = (tau - after) / period + 1e-9
      rem_after = r - r % 1
      local span = after / limit
      local f = span % 1
      local whole = span - f
      value = string.format('%d', now + whole)
      reset_after = whole
      if f > 0 then reset_after = whole + 1 end
      if code == 'b' then
        wait = backlog / limit
        f = wait % 1
        if f > 0 then wait = wait - f + 1 end
      end
      px = span / 1000
      f = px % 1
      if f > 0 then px = px - f + 1 end
    else
      if r < 1e-9 then rem_now = 0 else rem_now = r - r % 1 end  -- none left below 0
      reset_after = backlog / limit
      local f = reset_after % 1
      if f > 0 then reset_after = reset_after - f + 1 end
      if cost > burst then
        wait = period
      else
        wait = (after - tau) / limit
        f = wait % 1
        if f > 0 then wait = wait - f + 1 end
      end
    end

  elseif code == 'f' or code == 'k' then
    -- Windows are computed in whole seconds: now / period in microseconds can round
    -- up across a boundary in double precision.
    local w, starts, ends
    if code == 'f' then
      a = x
      w = (now_s - now_s % period_s) / period_s
      starts = w * period_s
      ends = starts + period_s
    else
      a = x + 4
      local s1, s2, s3, s4 = argv[x] + 0, argv[x + 1] + 0, argv[x + 2] + 0, argv[x + 3] + 0
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
    local v = call('GET', key)
    if v then
      local sw, sc = string.match(v, '^(%d+):(%d+)$')
      if sw and sw + 0 == w then count = sc + 0 end
    end
    reset_after = ends * 1000000 - now
    rem_now = limit - count
    if rem_now < 0 then rem_now = 0 end
    if count + cost <= limit then
      ok, rem_after = true, limit - count - cost
      value = string.format('%d:%d', w, count + cost)
      px = ends * 1000 - (now - now % 1000) / 1000
    elseif cost > limit then
      wait = (ends - starts) * 1000000
    else
      wait = reset_after
    end

  elseif code == 'c' then
    a = x
    local w = (now_s - now_s % period_s) / period_s
    period = period_s * 1000000
    local cur, prev = 0, 0
    local v = call('GET', key)
    if v then
      local n = tonumber(v)
      if n then
        local d = (n - n % 1e15) / 1e15
        local b, m = 10 ^ d, 10 ^ (15 - 2 * d)
        local tag = n % m
        local pair = (n - d * 1e15 - tag) / m
        if tag == w % m then
          prev = pair % b
          cur = (pair - prev) / b
        elseif tag == (w - 1) % m then
          prev = (pair - pair % b) / b
        end
      else
        local sw, sc, sp = string.match(v, '^(%d+):(%d+):(%d+)$')
        if sw then
          sw = sw + 0
          if sw == w then
            cur, prev = sc + 0, sp + 0
          elseif sw == w - 1 then
            prev = sc + 0
          end
        end
      end
    end
    local elapsed = now - w * period
    local left = period - elapsed
    local weighted = prev * left / period
    local ttl = (w + 2) * period - now
    reset_after = ttl
    local r = limit - cur - weighted
    if r < 0 then r = 0 else r = r + 1e-9 r = r - r % 1 end
    rem_now = r
    if prev * left + (cur + cost) * period <= limit * period then
      ok = true
      r = limit - cur - cost - weighted
      if r < 0 then r = 0 else r = r + 1e-9 r = r - r % 1 end
      rem_after = r
      cur = cur + cost
      local most = cur > prev and cur or prev
      if most < 100000 then
        local d, b = 1, 10
        while most >= b do d, b = d + 1, b * 10 end
        local m = 1e15 / (b * b)
        value = string.format('%d', d * 1e15 + (cur * b + prev) * m + w % m)
      else
        value = string.format('%d:%d:%d', w, cur, prev)
      end
      px = ttl / 1000
      local f = px % 1
      if f > 0 then px = px - f + 1 end
    else
      if cur == 0 then reset_after = left end
      if cost > limit then
        wait = ttl
      elseif cur + cost <= limit then
        -- Wait until the previous window's weight has shrunk enough.
        wait = math.ceil(period - (limit - cur - cost) * period / prev) - elapsed
      else
        -- Wait into the next window, where this window's count becomes the weighted one.
        wait = left + math.max(0, math.ceil(period - (limit - cost) * period / cur))
      end
    end

  elseif code == 'l' or code == 'n' then
    -- Sliding window log: a sorted set of the admitted requests, scored by time. A
    -- request of cost 1 is a member ("<microsecond><3-digit sequence>"); one of cost c
    -- is one member too, suffixed "x<c>", whose c - 1 extra units are kept in the
    -- tally member "#" (score minus the extra units of the set), so a costly request
    -- is one entry, not c. Concurrency: the same set, whose entries are leases ended
    -- early by a refund.
    --
    -- Whatever the set's size, a decision makes a bounded number of commands, each
    -- finding its place by rank or score (O(log n)) and touching at most STEP + 1
    -- entries: the set's order is "#" (negative score), then the dead entries (at most
    -- floor), then the live ones, so an entry's rank is a count away. At most
    -- BATCHES * STEP dead entries are read per call (see below).
    a = x
    period = period_s * 1000000
    local floor = now - period
    floor_s = string.format('%d', floor)
    -- Counts only (integer replies, the cheapest for the script to read): "#" and the
    -- dead entries are the members up to floor, the live ones those after it.
    local t, extra, dead = 0, 0, 0  -- t: 1 if "#" is there (rank 0)
    local n = call('ZCOUNT', key, '-inf', floor_s)
    local live = call('ZCOUNT', key, '(' .. floor_s, '+inf')
    if n > 0 then
      local units = call('ZSCORE', key, '#')
      if units then t, extra = 1, -units end
      dead = n - t
    end
    -- A member's units: 1, or what follows its "x" (past its 16-digit microsecond).
    local find, sub = string.find, string.sub
    local seen  -- the oldest STEP live entries' members, read at most once
    local tally = extra  -- what "#" holds once the dead entries read are taken off it
    if extra > 0 and dead > 0 then
      -- Costly entries that expired give their extra units back: the oldest dead
      -- entries are read, STEP at a time, and removed, up to BATCHES batches a call.
      -- While some are left unread, the tally may still hold their units: the live
      -- entries' share of it is then exact only when they are read too (STEP of them
      -- at most, so after one batch); otherwise it is at most the whole tally, the
      -- count used (the safe side: a request is admitted only if it fits there; later
      -- calls read on). This housekeeping changes nothing a decision can see, so it
      -- is done even when nothing else is.
      local batches = 0
      repeat
        local n = dead < STEP and dead or STEP
        local batch = call('ZRANGE', key, t, t + n - 1)
        for j = 1, n do
          local m = batch[j]
          local c = find(m, 'x', 17, true)
          if c then tally = tally - (sub(m, c + 1) - 1) end
        end
        call('ZREM', key, unpack(batch))  -- the commands of docs/deploying.md's ACL
        dead, batches = dead - n, batches + 1
      until dead == 0 or tally <= 0 or live <= STEP or batches == BATCHES
      if tally > 0 then
        call('ZADD', key, -tally, '#')
      else
        tally, t = 0, 0
        call('ZREM', key, '#')
      end
      extra = tally
      if dead > 0 and tally > 0 and live > 0 and live <= STEP then
        seen = call('ZRANGE', key, t + dead, -1)
        extra = 0
        for j = 1, #seen do
          local m = seen[j]
          local c = find(m, 'x', 17, true)
          if c then extra = extra + sub(m, c + 1) - 1 end
        end
      end
    end
    if live == 0 then extra = 0 end
    local count = live + extra
    rem_now = limit - count
    if rem_now < 0 then rem_now = 0 end
    if count + cost <= limit then
      ok, rem_after, reset_after = true, limit - count - cost, period
      -- Logged at now, so it leaves the trailing interval exactly when the request
      -- does. Members stay distinct with a sequence number after the entries already
      -- logged at this microsecond (counted here, not at commit, so the same key twice
      -- in one call is logged once, as other algorithms write once).
      if not stamp then stamp = string.format('%d', now) end
      local seq, e = 0, period
      if live > 0 and call('ZCOUNT', key, stamp, '+inf') > 0 then
        -- The server's clock stepped back: entries at or after now. The key lives until
        -- its newest entry leaves the period.
        seq = call('ZCOUNT', key, stamp, stamp)
        e = call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] - now + period
      end
      -- One integer of 19 digits, which Redis stores in 8 bytes (a string would cost
      -- ~20); past 999 entries in one microsecond, a string keeps it unique.
      if seq == 0 then
        value = stamp .. '000'
      elseif seq < 1000 then
        value = stamp .. string.format('%03d', seq)
      else
        value = stamp .. ':' .. seq
      end
      if cost > 1 then value = value .. 'x' .. cost end
      px = (e - e % 1000) / 1000
      if px * 1000 < e then px = px + 1 end
      -- Dead entries left are trimmed at commit when none of them can be costly.
      trim = tally == 0 and dead or 0
    else
      reset_after = 0
      if live > 0 then
        reset_after = call('ZRANGE', key, -1, -1, 'WITHSCORES')[2] + period - now
      end
      wait = period
      if cost <= limit then
        -- The request fits once the (count + cost - limit) oldest live units expire.
        local need = count + cost - limit
        local first = t + dead  -- the oldest live entry's rank
        local rank
        if extra == 0 then
          rank = first + need - 1  -- one unit per entry
        else
          if not seen then
            seen = call('ZRANGE', key, first, first + STEP - 1)
          end
          for j = 1, #seen do
            local m = seen[j]
            local c = find(m, 'x', 17, true)
            need = need - (c and sub(m, c + 1) or 1)
            if need <= 0 then
              wait = call('ZSCORE', key, m) + period - now  -- one score, not STEP
              break
            end
          end
          if need > 0 then
            -- Past the entries read, every entry is at least one unit: the one need
            -- entries further is late enough (exactly the one, when none of them is
            -- costly), and the newest always is.
            rank = first + #seen + need - 1
            if rank > first + live - 1 then rank = first + live - 1 end
          end
        end
        if rank then
          wait = call('ZRANGE', key, rank, rank, 'WITHSCORES')[2] + period - now
        end
      end
      -- A lease usually ends long before it expires: ask again soon.
      if code == 'n' and wait > 1000000 then wait = 1000000 end
    end
  end

  if not ok then
    if block ~= '0' and bkey ~= key and not blocked and not dry then
      if not blocks then blocks = {} end
      blocks[#blocks + 1] = bkey
      blocks[#blocks + 1] = block .. '000'
      blocked = true
      local block_us = block * 1000000
      if wait < block_us then wait = block_us end
      if reset_after < wait then reset_after = wait end
    end
    if enforce then admitted = false end
  end
  local nxt = argv[a]
  if i == 1 and not nxt then break end
  if not reply then
    -- Sized for five checks up front: a table grown one slot at a time is copied at
    -- every power of two. Slots past the last check stay nil, where the reply ends.
    reply = {now, 1, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
    pend = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
  end
  local r = 4 * i - 2
  reply[r + 1] = ok and 1 or blocked and 2 or 0
  reply[r + 2] = rem_now
  reply[r + 3] = reset_after
  reply[r + 4] = wait
  if ok then
    local p = 8 * i - 8
    pend[p + 1], pend[p + 2], pend[p + 3], pend[p + 4] = code, key, value, px
    -- A log's slot of the period holds its trim: its write needs no period.
    if code == 'l' or code == 'n' then period = trim end
    pend[p + 5], pend[p + 6], pend[p + 7], pend[p + 8] = rem_after, period, cost, floor_s
  end
  code = nxt
end

if not reply and not floor_s then
  -- One check, not a log: its reply and its write come straight from its locals.
  if ok then
    if not dry then
      if px >= 1e8 then px = string.format('%d', px) end
      call('SET', key, value, 'PX', px)
      rem_now = rem_after
    end
    return {now, 1, 1, rem_now, reset_after, wait}
  end
  if blocks then call('SET', blocks[1], '1', 'PX', blocks[2]) end
  return {now, admitted and 1 or 0, blocked and 2 or 0, rem_now, reset_after, wait}
end

if blocks then
  for j = 1, #blocks, 2 do
    call('SET', blocks[j], '1', 'PX', blocks[j + 1])
  end
end
if admitted and not dry then
  for j = 1, reply and i or 1 do
    if reply then
      local p = 8 * j - 8
      code = pend[p + 1]
      ok = code ~= nil
      if ok then
        key, value, px, rem_after = pend[p + 2], pend[p + 3], pend[p + 4], pend[p + 5]
        period, cost, floor_s = pend[p + 6], pend[p + 7], pend[p + 8]
        reply[4 * j] = rem_after  -- committed: report what remains after it
      end
    end
    if ok then
      if code == 'l' or code == 'n' then
        if reply then trim = period end
        -- ZADD before any other write: Redis lets a script that has written go on past
        -- maxmemory, and ZREMRANGEBYSCORE is a write that OOM does not refuse.
        call('ZADD', key, stamp, value)
        if cost > 1 then call('ZINCRBY', key, 1 - cost, '#') end
        if trim > 0 then
          -- Dead entries of no costly request: STEP + 1 at most (and any logged in the
          -- same microsecond as the last), by score, so that the same key twice in one
          -- call never trims a live entry.
          local bound = floor_s
          if trim > STEP then
            local e = call('ZRANGE', key, STEP, STEP, 'WITHSCORES')[2]
            if e and e + 0 < floor_s + 0 then bound = e end
          end
          call('ZREMRANGEBYSCORE', key, '(0', bound)
        end
        if px >= 1e8 then px = string.format('%d', px) end
        call('PEXPIRE', key, px)
      else
        if px >= 1e8 then px = string.format('%d', px) end
        call('SET', key, value, 'PX', px)
      end
    end
  end
  if ok and not reply then rem_now = rem_after end
elseif reply then
  if not admitted then reply[2] = 0 end
end
if reply then return reply end
return {now, admitted and 1 or 0, ok and 1 or blocked and 2 or 0, rem_now, reset_after,
  wait}
