-- refund.lua: give back what decide.lua committed for some checks.
--
-- Used when a request is rejected in one slot group of a Redis Cluster after
-- another group committed it (so a rejected request consumes nothing), by
-- refund() and refund_key() (an attempt counted before it happened that turned
-- out fine), and to end a concurrency lease when its request is finished. A
-- refund never takes a state below empty and keeps each key's TTL.
--
-- KEYS[i]  state key of check i
-- ARGV[1]  the time of the decision to undo, in microseconds (decide.lua's now_us),
--          or 0: no decision known, give back from the newest state
-- ARGV[2 + 5*(i-1) ...]  for check i: algorithm code, limit, period (seconds),
--          burst (a calendar window's starts), cost, as given to decide.lua
-- Returns  the number of keys changed

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

for i = 1, #KEYS do
  local a = 2 + 5 * (i - 1)
  local code = ARGV[a]
  local limit = tonumber(ARGV[a + 1])
  local period_s = tonumber(ARGV[a + 2])
  local cost = tonumber(ARGV[a + 4])
  local key = KEYS[i]

  if code == 'f' or code == 'c' or code == 'k' then
    -- Only the window the decision counted in holds its count (for the sliding
    -- counter, as the previous window once the next one has begun).
    local w
    if code == 'k' then
      -- The start of the calendar window holding the decision's time.
      for s in string.gmatch(ARGV[a + 3], '%d+') do
        if tonumber(s) <= at_s then w = tonumber(s) end
      end
      code = 'f'
    else
      w = math.floor(at_s / period_s)
    end
    local v = redis.call('GET', key)
    if v then
      local sw, sc, sp = string.match(v, '^(%d+):(%d+):?(%d*)$')
      sw, sc = tonumber(sw), tonumber(sc)
      local value = nil
      if code == 'f' and sw == w then
        value = string.format('%d:%d', w, math.max(0, sc - cost))
      elseif code == 'c' and sw == w then
        value = string.format('%d:%d:%s', w, math.max(0, sc - cost), sp)
      elseif code == 'c' and sw == w + 1 then
        value = string.format('%d:%d:%d', sw, sc, math.max(0, tonumber(sp) - cost))
      end
      if value then
        redis.call('SET', key, value, 'KEEPTTL')
        changed = changed + 1
      end
    end

  elseif (code == 'l' or code == 'n') and newest then
    -- No decision time: the newest entries go (the same count, a moment younger).
    if #redis.call('ZPOPMAX', key, cost) > 0 then changed = changed + 1 end

  elseif code == 'l' or code == 'n' then
    -- The decision logged its units at its own microsecond, after any entries
    -- already there: the last ones at that score are its own.
    local stamp = string.format('%d', at)
    local members = redis.call('ZRANGEBYSCORE', key, stamp, stamp)
    local drop = {}
    for j = #members, math.max(1, #members - cost + 1), -1 do
      drop[#drop + 1] = members[j]
      if #drop >= 1000 then
        redis.call('ZREM', key, unpack(drop))
        drop = {}
      end
    end
    if #drop > 0 then redis.call('ZREM', key, unpack(drop)) end
    if #members > 0 then changed = changed + 1 end

  else
    -- Buckets: move the theoretical arrival time back by what the cost added.
    local tat = tonumber(redis.call('GET', key) or 0)
    if tat > 0 then
      if not now then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
      local back = tat - math.floor(cost * period_s * 1000000 / limit)
      if back <= now then
        redis.call('DEL', key)
      else
        redis.call('SET', key, string.format('%d', back), 'PX', math.ceil((back - now) / 1000))
      end
      changed = changed + 1
    end
  end
end
return changed
