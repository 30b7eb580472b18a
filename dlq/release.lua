-- release.lua: end a replay: delete its lease, and its cursor when the replay
-- has finished, if this replay still holds the lease.
-- KEYS[1]  replay lease key (string: the holder's token)
-- KEYS[2]  replay cursor key (hash)
-- ARGV[1]  lease token
-- ARGV[2]  "1" to delete the cursor too (the replay reached its end), "0" to keep it
-- Returns  1, or 0 when the lease is not ours (nothing written).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '1' then redis.call('DEL', KEYS[2]) end
redis.call('DEL', KEYS[1])
return 1
