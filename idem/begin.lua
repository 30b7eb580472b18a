-- begin.lua: start an operation, or report the record a key already has.
-- KEYS[1]  the key's record: a hash {status, owner, result, reason}; status
--          is processing, completed or failed
-- ARGV[1]  owner token of the caller
-- ARGV[2]  lease in milliseconds (>= 1)
-- Returns  {status, owner, result, reason}: status "started" when the caller
--          now owns a new processing record (expiring after the lease),
--          "in_progress" when another owner's record is processing, or the
--          record's "completed" / "failed" status with its fields.
-- A processing record expires with its lease (PEXPIRE), so an expired one
-- is absent here and taken over.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 or lease ~= math.floor(lease) then
  return redis.error_reply('ERR idem: lease must be a positive integer')
end
-- Under an ACL that denies the PEXPIRE, the HSET before it would leave a
-- record without a TTL: check first (Redis 7).
if redis.acl_check_cmd and not (redis.acl_check_cmd('HSET', KEYS[1], 'f', 'v') and redis.acl_check_cmd('PEXPIRE', KEYS[1], '1')) then
  return redis.error_reply('NOPERM the user may not run HSET or PEXPIRE on the record')
end
local r = redis.call('HMGET', KEYS[1], 'status', 'owner', 'result', 'reason')
if not r[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'status', 'processing', 'owner', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease)
  return {'started', ARGV[1], '', ''}
end
if r[1] == 'processing' then
  return {'in_progress', r[2] or '', '', ''}
end
return {r[1], r[2] or '', r[3] or '', r[4] or ''}
