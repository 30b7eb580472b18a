-- retry.lua: end this delivery and schedule the job's next attempt.
-- KEYS[1]  stream
-- KEYS[2]  delayed set (sorted set; score = due time, Unix ms by Redis TIME)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  entry ID
-- ARGV[4]  delay, ms
-- ARGV[5]  delayed-set member (the new entry, encoded), used when delay > 0
-- ARGV[6..] the new entry's fields, used when delay <= 0
-- Returns  the new entry's ID ("" when it went to the delayed set), or -1 when
--          this consumer does not own the entry (nothing was written).
-- Every check comes before the first write, and the first write is the XACK:
-- Redis refuses a script's first write that needs memory while it is over
-- maxmemory (noeviction), but lets a script that has written go on, so a
-- retry still settles when Redis is full. The consumer deletes the old entry
-- afterwards (ack.lua), which frees about what the new one takes.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p ~= 1 or p[1][2] ~= ARGV[2] then return -1 end
local delay = tonumber(ARGV[4])
local due
if delay > 0 then
  local t = redis.call('TIME')
  due = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + delay)
end
-- Under an ACL that denies a later command, a script fails halfway and keeps
-- what it wrote (the XACK: the job would be lost): check first (Redis 7).
if redis.acl_check_cmd and not (redis.acl_check_cmd('XACK', KEYS[1], ARGV[1], ARGV[3])
    and redis.acl_check_cmd('ZADD', KEYS[2], '0', 'm') and redis.acl_check_cmd('XADD', KEYS[1], '*', 'f', 'v')) then
  return redis.error_reply('NOPERM the user may not run XACK, ZADD on the delayed set, or XADD on the stream')
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
if delay > 0 then
  redis.call('ZADD', KEYS[2], due, ARGV[5])
  return ''
end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 6))
