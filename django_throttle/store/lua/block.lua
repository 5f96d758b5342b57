-- block.lua: block clients under rules for a time, atomically (block_key(), the
-- dashboard's Block): decide.lua rejects a check while its block key lives, whatever
-- its rule.
--
-- KEYS     the block key of each check (the rule's, not its algorithm's: state_keys.py's
--          block_prefix, the client's {hash tag}, ":b"; one client's keys share the tag:
--          one cluster slot)
-- ARGV     milliseconds the blocks last
-- Returns  the number of keys written
local px = ARGV[1]
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], '1', 'PX', px)
end
return #KEYS
