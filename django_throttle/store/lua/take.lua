-- Take every waiting count for one fold into the database: the hash is renamed to the fold's
-- own key, so whichever process folds next finds only counts added since, and no count is
-- folded twice.
--
-- KEYS[1]: the hash of waiting counts; KEYS[2]: this fold's own key (same hash tag)
-- ARGV[1]: TTL of KEYS[2] (ms): how long the counts of a folder that died holding them stay
-- Returns 1 when there were counts (now under KEYS[2]), else 0.
if redis.call("EXISTS", KEYS[1]) == 0 then
  return 0
end
redis.call("RENAME", KEYS[1], KEYS[2])
redis.call("PEXPIRE", KEYS[2], ARGV[1])
return 1
