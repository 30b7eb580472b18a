-- finish.lua: complete or fail the caller's processing record.
-- KEYS[1]  the key's record (see begin.lua)
-- ARGV[1]  owner token of the caller
-- ARGV[2]  new status: "completed" or "failed"
-- ARGV[3]  field to set: "result" or "reason"
-- ARGV[4]  its value (binary safe)
-- ARGV[5]  retention in milliseconds (>= 1): the record's new TTL
-- Returns  1 when the record is now finished by the caller (or already was,
--          with the same status), 0 when the caller does not own it.
local retention = tonumber(ARGV[5])
if not retention or retention < 1 or retention ~= math.floor(retention) then
  return redis.error_reply('ERR idem: retention must be a positive integer')
end
-- Under an ACL that denies the PEXPIRE, the HSET before it would leave a
-- record without a TTL: check first (Redis 7).
if redis.acl_check_cmd and not (redis.acl_check_cmd('HSET', KEYS[1], 'f', 'v') and redis.acl_check_cmd('PEXPIRE', KEYS[1], '1')) then
  return redis.error_reply('NOPERM the user may not run HSET or PEXPIRE on the record')
end
local r = redis.call('HMGET', KEYS[1], 'status', 'owner')
if r[2] ~= ARGV[1] then
  return 0
end
if r[1] == ARGV[2] then
  return 1
end
if r[1] ~= 'processing' then
  return 0
end
redis.call('HSET', KEYS[1], 'status', ARGV[2], ARGV[3], ARGV[4])
redis.call('PEXPIRE', KEYS[1], retention)
return 1
