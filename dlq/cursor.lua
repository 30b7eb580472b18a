-- cursor.lua: write the replay cursor, if this replay still holds the lease.
-- KEYS[1]  replay lease key (string: the holder's token)
-- KEYS[2]  replay cursor key (hash)
-- ARGV[1]  lease token
-- ARGV[2]  cursor TTL in milliseconds
-- ARGV[3..] field/value pairs to set in the cursor hash (filter, end, last)
-- Returns  1, or -1 when the lease is not ours (nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
