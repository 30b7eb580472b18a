-- forget.lua: delete a key's finished record if it has the given status, so
-- that the next Begin starts the operation again.
-- KEYS[1]  the key's record (see begin.lua)
-- ARGV[1]  the status to forget: "completed" or "failed"
-- Returns  1 when the record was deleted, 0 when it is absent or has another
--          status. A processing record is never deleted: its owner runs the
--          operation, and its lease frees the key if that owner died.
if ARGV[1] ~= 'completed' and ARGV[1] ~= 'failed' then
  return redis.error_reply('ERR idem: only a completed or failed record can be forgotten')
end
if redis.call('HGET', KEYS[1], 'status') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
