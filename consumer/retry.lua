-- retry.lua: end these deliveries and schedule each job's next attempt.
-- KEYS[1]  stream
-- KEYS[2]  delayed set (sorted set; score = due time, Unix ms by Redis TIME)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3..] one group of values per job, in turn:
--          entry ID; delay, ms; the delayed-set member (the new entry,
--          encoded), used when delay > 0 ("" otherwise); n, the number of
--          values that follow; n values: the new entry's fields, used when
--          delay <= 0
-- Returns  per job, in order: the new entry's ID ("" when it went to the
--          delayed set), or -1 when this consumer does not own the entry
--          (nothing was written for it).
-- Every check comes before the first write, and the first write is the XACK:
-- Redis refuses a script's first write that needs memory while it is over
-- maxmemory (noeviction), but lets a script that has written go on, so
-- retries still settle when Redis is full. The consumer deletes the old
-- entries afterwards (ack.lua), which frees about what the new ones take.
local jobs, i = {}, 3
while i <= #ARGV do
  local n = tonumber(ARGV[i + 3])
  jobs[#jobs + 1] = {id = ARGV[i], delay = tonumber(ARGV[i + 1]), member = ARGV[i + 2], first = i + 4, last = i + 3 + n}
  i = i + 4 + n
end
local owned = {}
for _, j in ipairs(jobs) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], j.id, j.id, 1)
  j.owned = #p == 1 and p[1][2] == ARGV[2]
  if j.owned then owned[#owned + 1] = j.id end
end
local out = {}
if #owned == 0 then
  for k = 1, #jobs do out[k] = -1 end
  return out
end
-- Under an ACL that denies a later command, a script fails halfway and keeps
-- what it wrote (the XACK: the jobs would be lost): check first (Redis 7).
if redis.acl_check_cmd and not (redis.acl_check_cmd('XACK', KEYS[1], ARGV[1], owned[1])
    and redis.acl_check_cmd('ZADD', KEYS[2], '0', 'm') and redis.acl_check_cmd('XADD', KEYS[1], '*', 'f', 'v')) then
  return redis.error_reply('NOPERM the user may not run XACK, ZADD on the delayed set, or XADD on the stream')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XACK', KEYS[1], ARGV[1], unpack(owned))
for k, j in ipairs(jobs) do
  if not j.owned then
    out[k] = -1
  elseif j.delay > 0 then
    redis.call('ZADD', KEYS[2], string.format('%.0f', now + j.delay), j.member)
    out[k] = ''
  else
    out[k] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, j.first, j.last))
  end
end
return out
