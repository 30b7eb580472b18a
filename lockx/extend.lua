-- extend.lua: compare-and-pexpire a lock.
-- KEYS[1]  the lock
-- ARGV[1]  the holder's token
-- ARGV[2]  the new TTL in milliseconds (>= 1), counted from now
-- Returns  1 when the lock held ARGV[1] and its TTL was set, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
