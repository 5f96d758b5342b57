-- hold.lua: keep KEYS[1] for at least ARGV[1] milliseconds (never shorter than it already
-- lives). Written before every block of block.lua with the block's length, it lives as long
-- as the longest such block; while it does, decisions read every rule's block key.
local px = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < px then
  redis.call('SET', KEYS[1], '1', 'PX', px)
end
return 1
