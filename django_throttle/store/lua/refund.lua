-- refund.lua: give back what decide.lua committed for some checks, or charge more.
--
-- Used when a request is rejected in one slot group of a Redis Cluster after
-- another group committed it (so a rejected request consumes nothing), by
-- refund() and refund_key() (an attempt counted before it happened that turned
-- out fine), and to end a concurrency lease when its request is finished. A
-- refund never takes a state below empty and keeps each key's TTL.
--
-- A negative cost charges instead (settle(): a request's actual cost known after its
-- response; charge_key()): that many units more, counted now, even past the limit (the
-- work is done), so that later decisions wait until it has drained. Never a concurrency
-- lease.
--
-- KEYS[i]  state key of check i
-- ARGV[1]  the time of the decision to undo, in microseconds (decide.lua's now_us),
--          or 0: no decision known, give back from the newest state
-- ARGV[2 + 5*(i-1) ...]  for check i: algorithm code (decide.lua's), limit, period
--          (seconds), a slot of the algorithm's (a calendar window's starts, "s1:s2:s3:s4";
--          a bucket's: the arrival time in microseconds its decision left, or 0), cost
--          (negative: a charge)
-- Returns  the number of keys changed
--
-- State is read and written in decide.lua's forms (see its header): a window's own
-- key, or the state key's form from before windows had keys of their own.

local at = tonumber(ARGV[1])
local now = nil
local newest = at == 0
if newest then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  at = now
end
local at_s = math.floor(at / 1000000)
local changed = 0

-- Charge ``cost`` units to a check's state now, in decide.lua's forms; 1 if written.
local function charge(key, code, limit, period_s, slot, cost)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local now_ms = (now - now % 1000) / 1000
  if code == 'f' or code == 'c' or code == 'k' then
    -- The window holding now: its key counts the units until it ends (the counter's, until
    -- the next one ends: it is read as the previous window then).
    local now_s = (now - now % 1000000) / 1000000
    local w, ends
    if code == 'k' then
      for s in string.gmatch(slot, '%d+') do
        s = tonumber(s)
        if s <= now_s then w = s elseif not ends then ends = s end
      end
      if not w or not ends then return 0 end  -- the caller's windows are not around now
    else
      w = (now_s - now_s % period_s) / period_s
      ends = (w + (code == 'c' and 2 or 1)) * period_s
    end
    local wkey = key .. ':' .. string.format('%d', w)
    if redis.call('INCRBY', wkey, cost) == cost then
      redis.call('PEXPIRE', wkey, string.format('%d', ends * 1000 - now_ms))
    end
  elseif code == 'l' then
    -- One entry logged now, of ``cost`` units, as decide.lua logs a costly request.
    local stamp = string.format('%d', now)
    local tail = cost > 1 and 'x' .. cost or ''
    if redis.call('ZADD', key, 'NX', stamp, stamp .. '000' .. tail) == 0 then
      local seq = redis.call('ZCOUNT', key, stamp, stamp)
      local value = seq < 1000 and stamp .. string.format('%03d', seq) or stamp .. ':' .. seq
      redis.call('ZADD', key, stamp, value .. tail)
    end
    if cost > 1 then redis.call('ZINCRBY', key, 1 - cost, '#') end
    -- The key lives until its newest entry leaves the period.
    local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    local ms = math.ceil((newest + period_s * 1000000 - now) / 1000)
    redis.call('PEXPIRE', key, string.format('%d', ms))
  elseif code == 't' or code == 'b' then
    -- The theoretical arrival time moves on by the cost's time, from now if it is past.
    local tat = tonumber(redis.call('GET', key) or 0)
    if tat < now then tat = now end
    tat = tat + math.floor(cost * period_s * 1000000 / limit)
    redis.call('SET', key, string.format('%d', tat), 'PX',
      string.format('%d', math.ceil((tat - now) / 1000)))
  else
    return 0
  end
  return 1
end

for i = 1, #KEYS do
  local a = 2 + 5 * (i - 1)
  local code = ARGV[a]
  local limit = tonumber(ARGV[a + 1])
  local period_s = tonumber(ARGV[a + 2])
  local cost = tonumber(ARGV[a + 4])
  local key = KEYS[i]

  if cost < 0 then
    changed = changed + charge(key, code, limit, period_s, ARGV[a + 3], -cost)
  elseif code == 'f' or code == 'c' or code == 'k' then
    -- Only the window the decision counted in holds its count: its own key,
    -- "<state key>:<window>", whether or not a later window has begun.
    local w
    if code == 'k' then
      -- The start of the calendar window holding the decision's time.
      for s in string.gmatch(ARGV[a + 3], '%d+') do
        if tonumber(s) <= at_s then w = tonumber(s) end
      end
    else
      w = math.floor(at_s / period_s)
    end
    local wkey = key .. ':' .. w
    local v = redis.call('GET', wkey)
    local old = not v and redis.call('GET', key)
    if v then
      local back = math.min(tonumber(v), cost)
      if back > 0 then redis.call('DECRBY', wkey, back) end  -- keeps the TTL
      changed = changed + 1
    elseif old and code == 'c' then
      -- A decision counted before windows had keys of their own, in the state key's
      -- forms of then (decide.lua moves them to the window keys at a window's first
      -- decision): written back in the form it had.
      local sw, cur, prev
      local n = tonumber(old)
      if n then
        local d = (n - n % 1e15) / 1e15
        local b, m = 10 ^ d, 10 ^ (15 - 2 * d)
        local tag = n % m
        local pair = (n - d * 1e15 - tag) / m
        prev = pair % b
        cur = (pair - prev) / b
        if tag == w % m then
          sw = w
        elseif tag == (w + 1) % m then
          sw = w + 1
        end
      else
        local a1, a2, a3 = string.match(old, '^(%d+):(%d+):(%d+)$')
        sw, cur, prev = tonumber(a1), tonumber(a2), tonumber(a3)
      end
      if sw == w then
        cur = math.max(0, cur - cost)
      elseif sw == w + 1 then
        prev = math.max(0, prev - cost)
      else
        sw = nil
      end
      if sw then
        local most = math.max(cur, prev)
        if most < 100000 then
          local d, b = 1, 10
          while most >= b do d, b = d + 1, b * 10 end
          local m = 1e15 / (b * b)
          v = string.format('%d', d * 1e15 + (cur * b + prev) * m + sw % m)
        else
          v = string.format('%d:%d:%d', sw, cur, prev)
        end
        redis.call('SET', key, v, 'KEEPTTL')
        changed = changed + 1
      end
    elseif old then
      local sw, sc = string.match(old, '^(%d+):(%d+)$')
      if tonumber(sw) == w then
        redis.call('SET', key, string.format('%d:%d', w, math.max(0, sc - cost)), 'KEEPTTL')
        changed = changed + 1
      end
    end

  elseif code == 'l' or code == 'n' then
    -- Give back cost units from the decision's own entries (the newest at its
    -- microsecond: ours came after any already there), or with no decision time from
    -- the newest entries (the same count, a moment younger). A costly entry
    -- ("...x<c>", its extra units in the tally "#") may be given back in part.
    -- Read 100 at a time (a costly entry is given back by the first read, however many
    -- units are asked for), again from the newest once all those read are given back.
    local hi = newest and '+inf' or string.format('%d', at)
    local lo = newest and '(0' or hi
    local left, extra_back, found = cost, 0, false
    repeat
      local want = left < 100 and left or 100
      local members = redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'LIMIT', 0, want)
      if #members > 0 then found = true end
      for _, m in ipairs(members) do
        local base, c = string.match(m, '^(.-)x(%d+)$')
        local units = tonumber(c or 1)
        if units <= left then
          redis.call('ZREM', key, m)
          left = left - units
          extra_back = extra_back + units - 1
        else
          local score = redis.call('ZSCORE', key, m)
          redis.call('ZREM', key, m)
          local rest = units - left
          if rest > 1 then base = base .. 'x' .. rest end
          redis.call('ZADD', key, score, base)
          extra_back = extra_back + left
          left = 0
        end
        if left <= 0 then break end
      end
    until left <= 0 or #members < want
    if extra_back > 0 and tonumber(redis.call('ZINCRBY', key, extra_back, '#')) >= 0 then
      redis.call('ZREM', key, '#')
    end
    if found then changed = changed + 1 end

  else
    -- Buckets: move the theoretical arrival time back by what the request still holds. Its
    -- own interval ended at the arrival time its decision left (ARGV's slot 4, 0 when not
    -- known): time since then refilled the bucket, and giving back the whole cost's time
    -- would also give back what later requests took (A admitted at 0, B at 1 s, A's
    -- give-back at 1.01 s would empty the bucket). Never more than the cost's time, nor the
    -- bucket's backlog. With no decision known, the whole cost's time, from the newest state.
    local tat = tonumber(redis.call('GET', key) or 0)
    if tat > 0 then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
      local held = math.floor(cost * period_s * 1000000 / limit)
      local ends = tonumber(ARGV[a + 3])
      if ends > 0 and not newest and ends - now < held then held = ends - now end
      if held > 0 then
        local back = tat - held
        if back <= now then
          redis.call('DEL', key)
        else
          -- PX as text: Redis 7.2+ would send a number of 10^8 ms or more as 1e+08.
          redis.call('SET', key, string.format('%d', back), 'PX',
            string.format('%d', math.ceil((back - now) / 1000)))
        end
        changed = changed + 1
      end
    end
  end
end
return changed
