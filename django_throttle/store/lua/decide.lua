-- decide.lua: decide one request against every rule that applies to it, atomically.
--
-- First every check is evaluated; then, only if every enforcing check admits
-- the request (and this is not a dry run), every check that admitted it is
-- committed. A rejected request consumes nothing from any rule: a window, counted
-- (INCRBY) as its check is evaluated, is given back (DECRBY) before the script ends.
-- Each key gets its TTL in the script that writes it (SET ... PX, PEXPIRE right after
-- the INCRBY that made it or after ZADD), so no key lives without expiry. Time is the
-- server's (TIME).
--
-- KEYS     for each check in order, its state key, then its block key when its spec says
--          one follows (every key of one client shares its {hash tag}: one cluster slot);
--          the state key again in its place when the block cannot be read (its slot
--          migrating: the block neither read nor started)
-- ARGV     "dry" first for a dry run (evaluate, write nothing); then for each check:
--            spec     period (seconds) * 64 + flags: the algorithm (1 fixed window, 2
--                     calendar window: a fixed window of weeks or months, 3 sliding window
--                     counter, 4 sliding window log, 5 token bucket, 6 leaky bucket, 7
--                     concurrency: the log's state, one entry per request in flight, a
--                     lease of one period removed by refund.lua when the request is
--                     finished) + 8 if block follows + 16 if cost follows + 32 if a block
--                     key follows the state key
--            limit    negative for a shadow rule (its rejection never rejects the request)
--            cost     if the spec says so; 1 otherwise
--            block    if the spec says so: seconds a rejection blocks the client for; a
--                     growing block, "<seconds>g<growth>m<memory seconds>" (see where a block starts)
--            burst    token and leaky bucket only: the bucket size
--            s1 s2 s3 s4   calendar windows only: the starts of four consecutive windows,
--                     epoch seconds
-- Returns  little-endian doubles (struct.pack: for Redis a table reply costs more than a
--          check's own commands): now_us, admitted, then for each check: state (1 allowed,
--          0 rejected, 2 rejected and blocked), remaining (a log-only window's count past
--          its limit: negative, how far past), reset_after_us, wait_us
--          (allowed: the delay before it may proceed, leaky bucket only; rejected:
--          retry_after); now_us, -1 with nothing written when the server's time is in none
--          of a calendar check's windows (the caller's clock is off: it asks again with
--          windows around now_us)
--
-- A block is a key of its own with a TTL: while it lives the check rejects without
-- looking at its algorithm, whatever the rule; a check of a rule with a block duration
-- that rejects starts one (even when the request is rejected, and so commits nothing
-- else), and block.lua writes one for any rule (block_key(), the dashboard's Block). The
-- caller sends a check's block key when its rule has a block duration, or while a block
-- of block.lua may live (the store's BlockReads).
--
-- State, with a TTL:
--   fixed and calendar windows  an integer key per window, "<state key>:<window>", the
--          window being its number since the epoch or, for a calendar window, its start
--          in epoch seconds; it lives until the window ends
--   sliding window counter  the same, living until the next window ends: the previous
--          window's count is read from its key
--   buckets  one integer, the theoretical arrival time (GCRA) in microseconds
--   log and concurrency  a sorted set of one entry per admitted request, scored by
--          its time (see below)
-- Before windows had keys of their own, their state was the state key itself: the fixed
-- window "window:count", the counter "window:current:previous" or one integer packing
-- both counts and the window (d * 10^15 + (current * 10^d + previous) * m + window % m,
-- m = 10^(15 - 2d), d the digits of the larger count). A window's first decision reads it
-- and moves what it holds of this window and the previous one to their keys (nothing is
-- lost on upgrade); refund.lua reads it too.
--
-- Windows are aligned to multiples of the period since the epoch (calendar
-- windows: to the starts the caller computed in its time zone).
--
-- Every call runs this whole body, so the hot path is written for Redis's Lua VM,
-- where each key or argument, table, C function call and number formatted costs as much
-- as a dozen VM instructions (bench/script.py --instructions counts them): as few
-- arguments as a check needs (the spec's flags); no table but, with several checks, the
-- reply and one of pending writes; a string known to hold a number read by arithmetic
-- (x + 0) rather than tonumber; floor and ceil by x % 1 rather than math.floor and
-- math.ceil; a cost given to Redis as the string it came as; and a window's number
-- formatted by %d, not tostring's %.14g. A number Redis can take as it is is given as a
-- number (below 10^8 it reaches Redis as the same digits on every version; from 10^8 on
-- it is formatted here, as Redis 7.2+ would send 1e+08, which PX refuses).

local call, pack = redis.call, struct.pack
local t = call('TIME')
local now_s = t[1] + 0
local now = now_s * 1000000 + t[2]
local argv, keys = ARGV, KEYS
local dry = argv[1] == 'dry'
local a = dry and 2 or 1
local admitted = true
local i, k = 0, 0  -- the check, its state key
-- The algorithms, as a check's spec names them.
local F, K, C, L, T, B, N = 1, 2, 3, 4, 5, 6, 7
local spec = argv[a]
-- The current check; after the loop, the only one when there is one: its reply is
-- built from these and its write made from them, with no table in between.
local code, key, ok, rem_now, rem_after, reset_after, wait, blocked
-- A check that admitted with nothing left to write: 'i' a window counted already (INCRBY,
-- given back if the request is rejected), 'd' a key an earlier check of this call counts.
local counted
local value, px, period, cost, floor_s, trim, stamp
-- The sliding log's reads: at most STEP entries each, BATCHES reads of dead entries a call.
local STEP, BATCHES = 100, 5
local reply, pend, blocks  -- several checks only; blocks: only when one starts

while spec do
  i, k = i + 1, k + 1
  key = keys[k]
  spec = spec + 0
  local flags = spec % 64
  local period_s = (spec - flags) / 64
  code = flags % 8
  local limit = argv[a + 1] + 0
  local enforce = limit > 0
  if not enforce then limit = -limit end
  a = a + 2
  -- The cost as sent: a number given to Redis would be formatted first.
  local cost_s = '1'
  cost = 1
  if flags % 32 >= 16 then
    cost_s = argv[a]
    cost = cost_s + 0
    a = a + 1
  end
  local block = 0
  if flags % 16 >= 8 then
    block = argv[a]
    a = a + 1
  end
  local x = a  -- the check's next argument
  local bkey = key
  if flags >= 32 then
    k = k + 1
    bkey = keys[k]
  end
  ok, wait, blocked, counted = false, 0, false, nil
  -- No block key, or the state key again in its place (a slot migrating, see cluster.py's
  -- _redirected): no block to read.
  local left = bkey ~= key and call('PTTL', bkey) or 0
  if left > 0 then
    blocked, rem_now, reset_after, wait = true, 0, left * 1000, left * 1000
  end

  if blocked then
    -- Rejected until the block ends, whatever the algorithm's state.
    if code == T or code == B then
      a = x + 1
    elseif code == K then
      a = x + 4
    else
      a = x
    end

  elseif code == F or code == K or code == C then
    -- Windows: an integer key per window, "<state key>:<window>", counted by INCRBY as the
    -- check is evaluated (what the count was is what it returns, less the cost) and given
    -- back by DECRBY if the request is rejected, by this check or another. Windows are
    -- computed in whole seconds: now / period in microseconds can round up across a
    -- boundary in double precision.
    local w, starts, ends
    if code == K then
      a = x + 4
      local s1, s2, s3, s4 = argv[x] + 0, argv[x + 1] + 0, argv[x + 2] + 0, argv[x + 3] + 0
      if now_s < s1 or now_s >= s4 then
        -- Nothing decided: the counts taken so far are given back.
        if pend then
          for p = 1, 8 * i - 8, 8 do
            if pend[p] == 'i' then call('DECRBY', pend[p + 1], pend[p + 6]) end
          end
        end
        return pack('<dd', now, -1)
      end
      if now_s < s2 then
        starts, ends = s1, s2
      elseif now_s < s3 then
        starts, ends = s2, s3
      else
        starts, ends = s3, s4
      end
      w = starts
    else
      a = x
      w = (now_s - now_s % period_s) / period_s
      starts = w * period_s
      ends = starts + period_s
    end
    local base = key
    key = base .. ':' .. string.format('%d', w)
    local prev, pkey = 0, nil
    if code == C then
      pkey = base .. ':' .. (w - 1)
      prev = call('GET', pkey)
      if prev then prev = prev + 0 end
    end
    local n, dup
    if pend then
      -- The same window counted by an earlier check of this call (a rule passed twice):
      -- counted once, decided alike.
      for p = 1, 8 * i - 8, 8 do
        if pend[p + 1] == key and pend[p] == 'i' then dup = true end
      end
    end
    if dry or dup then
      n = call('GET', key)
      if n then n = n + (dup and 0 or cost) end
    else
      n = call('INCRBY', key, cost_s)
    end
    if n == cost or not n then
      -- A new window (or one emptied): the state key of before windows had keys of their
      -- own ("window:count"; the counter: either of its forms below) is read, and its
      -- counts of this window and the previous one moved here, once; then the key's TTL.
      n = n or cost
      local v = call('GET', base)
      if v then
        local sw, sc, sp
        local num = tonumber(v)
        if code ~= C then
          sw, sc = string.match(v, '^(%d+):(%d+)$')
        elseif num then
          -- The counter's integer form: d * 10^15 + (current * 10^d + previous) * m + window
          -- % m, m = 10^(15 - 2d): its window known modulo m (at least 10^5).
          local d = (num - num % 1e15) / 1e15
          local b, m = 10 ^ d, 10 ^ (15 - 2 * d)
          local tag = num % m
          local pair = (num - d * 1e15 - tag) / m
          sp = pair % b
          sc = (pair - sp) / b
          if tag == w % m then sw = w elseif tag == (w - 1) % m then sw = w - 1 end
        else
          sw, sc, sp = string.match(v, '^(%d+):(%d+):(%d+)$')
        end
        sw, sc = sw and sw + 0, sc and sc + 0 or 0
        local old_prev
        if sw == w then
          if sc > 0 then
            if dry then n = n + sc else n = call('INCRBY', key, sc) end
          end
          if sp then old_prev = sp + 0 end
        elseif sw == w - 1 and code == C then
          old_prev = sc
        end
        if old_prev and old_prev > 0 and not prev then
          prev = old_prev
          if not dry then
            local left_ms = (w + 1) * period_s * 1000 - (now - now % 1000) / 1000
            call('SET', pkey, old_prev, 'PX', left_ms >= 1e8 and string.format('%d', left_ms) or left_ms)
          end
        end
        if not dry then call('DEL', base) end
      end
      if not dry then
        local ttl_ms = (code == C and (w + 2) * period_s or ends) * 1000
          - (now - now % 1000) / 1000
        if ttl_ms >= 1e8 then ttl_ms = string.format('%d', ttl_ms) end
        call('PEXPIRE', key, ttl_ms)
      end
    end
    prev = prev or 0
    local count = n - cost
    if code ~= C then
      reset_after = ends * 1000000 - now
      rem_now = limit - count
      if rem_now < 0 then rem_now = 0 end
      if n <= limit then
        ok, rem_after = true, limit - n
      elseif cost > limit then
        wait = (ends - starts) * 1000000
      else
        wait = reset_after
      end
    else
      -- Sliding window counter: this window's count and the previous one's weighted by
      -- how much of it is still inside the trailing period.
      period = period_s * 1000000
      local elapsed = now - w * period
      local left = period - elapsed
      local weighted = prev * left / period
      local ttl = (w + 2) * period - now
      reset_after = ttl
      local r = limit - count - weighted
      if r < 0 then r = 0 else r = r + 1e-9 r = r - r % 1 end
      rem_now = r
      if prev * left + n * period <= limit * period then
        ok = true
        r = limit - n - weighted
        if r < 0 then r = 0 else r = r + 1e-9 r = r - r % 1 end
        rem_after = r
      else
        if count == 0 then reset_after = left end
        if cost > limit then
          wait = ttl
        elseif n <= limit then
          -- Wait until the previous window's weight has shrunk enough.
          wait = math.ceil(period - (limit - n) * period / prev) - elapsed
        else
          -- Wait into the next window, where this window's count becomes the weighted one.
          wait = left + math.max(0, math.ceil(period - (limit - cost) * period / count))
        end
      end
    end
    if not dry then
      if ok then
        counted = dup and 'd' or 'i'
      elseif not dup then
        if enforce or code == C then
          call('DECRBY', key, cost)
        else
          -- A log-only rule's window goes on counting past its limit, so that sizing sees
          -- how far clients go (given back, as any count, if an enforcing check rejects the
          -- request); its remaining is then how far past the limit, negative. value keeps
          -- what remains without it, the reply's if it is given back.
          counted, value, rem_after = 'i', rem_now, limit - n
          rem_now = rem_after
        end
      end
    end

  elseif code == T or code == B then
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
      if code == B then
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

  elseif code == L or code == N then
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
    local live = call('ZCARD', key) - n
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
      -- does. The key lives until its newest entry leaves the period: if the server's
      -- clock stepped back, an entry may be newer than now. From Redis 7.0 a key that
      -- exists has its TTL only lengthened (PEXPIRE GT: px < 0 below), which keeps it;
      -- before, the newest entry is read when entries at or after now exist. Members
      -- stay distinct: one logged at a microsecond already logged gets a sequence number
      -- (see the commit). The same key twice in one call is logged once, as other
      -- algorithms write once.
      if not stamp then stamp = string.format('%d', now) end
      local seq, e = 0, period
      if pend then
        for p = 1, 8 * i - 8, 8 do
          if pend[p + 1] == key and (pend[p] == L or pend[p] == N) then counted = 'd' end
        end
      end
      local gt = live + n > 0 and (redis.REDIS_VERSION_NUM or 0) >= 0x070000
      if not gt and live > 0 and call('ZCOUNT', key, stamp, '+inf') > 0 then
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
      if gt then px = -px end
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
      if code == N and wait > 1000000 then wait = 1000000 end
    end
  end

  if not ok then
    if block ~= 0 and bkey ~= key and not blocked and not dry then
      if not blocks then blocks = {} end
      blocks[#blocks + 1] = bkey
      -- A growing block, "<seconds>g<growth>m<memory>": its level (the blocks the client had
      -- while remembered) lives beside the block key (its tag: the same slot) for the block
      -- and memory seconds; this block lasts first x growth ^ level seconds, at most a week
      -- (or the first block). Here, not in a function: a closure would be made every call.
      local g = string.find(block, 'g', 1, true)
      if g then
        local m = string.find(block, 'm', g, true)
        local first, lkey = string.sub(block, 1, g - 1) + 0, bkey .. 'g'
        local level = call('GET', lkey)
        level = level and level + 0 or 0
        local seconds = first * string.sub(block, g + 1, m - 1) ^ level
        local cap = first > 604800 and first or 604800
        if seconds > cap then seconds = cap end
        seconds = seconds - seconds % 1
        call('SET', lkey, level + 1, 'PX',
          string.format('%d', (seconds + string.sub(block, m + 1)) * 1000))
        block = string.format('%d', seconds)
      end
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
  if ok or counted then
    local p = 8 * i - 8
    pend[p + 1], pend[p + 2], pend[p + 3], pend[p + 4] = counted or code, key, value, px
    -- A log's slot of the period holds its trim: its write needs no period.
    if code == L or code == N then period = trim end
    pend[p + 5], pend[p + 6], pend[p + 7], pend[p + 8] = rem_after, period, cost, floor_s
  end
  spec = nxt
end

if not reply and not floor_s then
  -- One check, not a log: its reply and its write come straight from its locals.
  if ok then
    if not dry then
      if not counted then
        if px >= 1e8 then px = string.format('%d', px) end
        call('SET', key, value, 'PX', px)
      end
      rem_now = rem_after
    end
    return pack('<dddddd', now, 1, 1, rem_now, reset_after, wait)
  end
  if blocks then call('SET', blocks[1], '1', 'PX', blocks[2]) end
  return pack('<dddddd', now, admitted and 1 or 0, blocked and 2 or 0, rem_now, reset_after,
    wait)
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
      if code == L or code == N then
        if reply then trim = period end
        -- ZADD before any other write: Redis lets a script that has written go on past
        -- maxmemory, and ZREMRANGEBYSCORE is a write that OOM does not refuse.
        if call('ZADD', key, 'NX', stamp, value) == 0 then
          -- This microsecond logged already (the server's clock stepped back): the
          -- entries logged at it numbered, one integer of 19 digits up to 999 of them.
          local seq = call('ZCOUNT', key, stamp, stamp)
          value = stamp .. (seq < 1000 and string.format('%03d', seq) or ':' .. seq)
          if cost > 1 then value = value .. 'x' .. cost end
          call('ZADD', key, stamp, value)
        end
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
        if px < 0 then
          px = -px
          if px >= 1e8 then px = string.format('%d', px) end
          call('PEXPIRE', key, px, 'GT')
        else
          if px >= 1e8 then px = string.format('%d', px) end
          call('PEXPIRE', key, px)
        end
      elseif code ~= 'i' and code ~= 'd' then  -- a window was counted as it was evaluated
        if px >= 1e8 then px = string.format('%d', px) end
        call('SET', key, value, 'PX', px)
      end
    end
  end
  if ok and not reply then rem_now = rem_after end
elseif reply and not admitted then
  reply[2] = 0
  if not dry then
    for p = 1, 8 * i, 8 do
      if pend[p] == 'i' then
        call('DECRBY', pend[p + 1], pend[p + 6])
        -- A log-only window counted past its limit is given back too: its remaining is
        -- what remains without it (check j's is reply[4 * j], and p = 8 * j - 7).
        local r = (p + 7) / 2
        if reply[r] < 0 then reply[r] = pend[p + 2] end
      end
    end
  end
end
if reply then return pack('<' .. string.rep('d', 2 + 4 * i), unpack(reply, 1, 2 + 4 * i)) end
return pack('<dddddd', now, admitted and 1 or 0, ok and 1 or blocked and 2 or 0, rem_now,
  reset_after, wait)
