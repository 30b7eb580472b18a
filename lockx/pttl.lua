-- pttl.lua: the remaining TTL of a lock, if the caller still holds it.
-- KEYS[1]  the lock
-- ARGV[1]  the holder's token
-- Returns  the remaining TTL in milliseconds (>= 0), or -3 when the lock
--          does not hold ARGV[1].
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return -3
