-- release.lua: compare-and-delete a lock.
-- KEYS[1]  the lock
-- ARGV[1]  the holder's token
-- Returns  1 when the lock held ARGV[1] and was deleted, 0 otherwise (it
--          expired, and may now belong to someone else, whose lock stays).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
