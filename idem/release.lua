-- release.lua: delete the caller's processing record, so that the next
-- Begin starts the operation again.
-- KEYS[1]  the key's record (see begin.lua)
-- ARGV[1]  owner token of the caller
-- Returns  1 when the record was deleted, 0 when the caller does not own a
--          processing record for the key.
local r = redis.call('HMGET', KEYS[1], 'status', 'owner')
if r[1] ~= 'processing' or r[2] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
