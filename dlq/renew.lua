-- renew.lua: extend the replay lease, if this replay still holds it.
-- KEYS[1]  replay lease key (string: the holder's token)
-- ARGV[1]  lease token
-- ARGV[2]  lease TTL in milliseconds
-- Returns  1, or 0 when the lease is not ours (expired or taken: nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
