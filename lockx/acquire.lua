-- acquire.lua: take a lock if nobody holds it, and number the acquisition.
-- KEYS[1]  the lock: a string holding the holder's token, with a TTL
-- KEYS[2]  the key's fencing counter (no TTL); shares KEYS[1]'s hash tag
-- ARGV[1]  the new holder's token (random, unique per acquisition)
-- ARGV[2]  TTL in milliseconds (>= 1)
-- Returns  the fencing token (>= 1): the counter after INCR, so it grows
--          with every acquisition of the key, whoever makes it; or 0 when
--          the lock is held (nothing is changed).
-- SET NX and INCR run in one script, so no two holders of a key ever get
-- the same fencing token and the token order is the acquisition order.
-- Under an ACL that denies the INCR, the SET before it would hold the lock
-- without a fencing token: check first (Redis 7).
if redis.acl_check_cmd and not redis.acl_check_cmd('INCR', KEYS[2]) then
  return redis.error_reply('NOPERM the user may not run INCR on the fencing counter')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
