-- Add one process's rejection counts to those waiting to be folded into the database, naming
-- at most ARGV[3] clients per minute, all rules together, and at least ARGV[4] per rule and
-- action whatever the others took; the other clients count as "(other clients)".
--
-- KEYS[1]: the hash of waiting counts: field = JSON [minute, rule, action, key, display],
--          value = rejections
-- KEYS[2..]: per minute of this call, the hash of the clients named in it: a member
--            (rule, action, key) -> 1, a group (rule, action) -> how many it named, and
--            "#" -> how many are named in the minute
-- ARGV[1]: TTL of KEYS[1] (ms); ARGV[2]: TTL of the named hashes (ms)
-- ARGV[3]: clients named per minute; ARGV[4]: clients each rule and action may name anyway
-- ARGV[5..]: six values per count: the index in KEYS of its minute's hash, its group, its
--            member ("" when the count is under "(other clients)" already), its field, the
--            field of "(other clients)" of its rule, action and minute, the count
-- Returns the rejections that went to "(other clients)" here.
local budget, floor = tonumber(ARGV[3]), tonumber(ARGV[4])
local other = 0
for i = 5, #ARGV, 6 do
  local named = KEYS[tonumber(ARGV[i])]
  local group, member, field, n = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], tonumber(ARGV[i + 5])
  if member ~= "" and redis.call("HEXISTS", named, member) == 0 then
    if tonumber(redis.call("HGET", named, group) or "0") < floor
        or tonumber(redis.call("HGET", named, "#") or "0") < budget then
      redis.call("HSET", named, member, 1)
      redis.call("HINCRBY", named, group, 1)
      redis.call("HINCRBY", named, "#", 1)
    else
      field = ARGV[i + 4]
      other = other + n
    end
  end
  redis.call("HINCRBY", KEYS[1], field, n)
end
redis.call("PEXPIRE", KEYS[1], ARGV[1])
for k = 2, #KEYS do
  redis.call("PEXPIRE", KEYS[k], ARGV[2])
end
return other
