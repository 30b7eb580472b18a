-- retry.lua: end these deliveries and schedule each job's next attempt.
-- KEYS[1]  stream
-- KEYS[2]  delayed set (sorted set; score = due time, Unix ms by Redis TIME)
-- KEYS[3..] the index records of the tracked jobs ({stream}:job:<job id>,
--          stream/index.go)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3..] one group of values per job, in turn:
--          entry ID; delay, ms; the delayed-set member (the new entry,
--          encoded), used when delay > 0 ("" otherwise); k, the index in
--          KEYS of the job's index record, 0 for an untracked job; the
--          error to record for a tracked job; n, the number of values that
--          follow; n values: the new entry's fields, used when delay <= 0
-- A tracked job's record becomes "retrying" with its due time and error, or
-- "waiting" with its new entry ID.
-- Returns  per job, in order: the new entry's ID ("" when it went to the
--          delayed set), -1 when this consumer does not own the entry
--          (nothing was written for it), or -2 when the job's record says
--          "cancelling" for this entry (control.Cancel): nothing was
--          written for it, the consumer settles it as cancelled instead.
-- Every check comes before the first write, and the first write is the XACK:
-- Redis refuses a script's first write that needs memory while it is over
-- maxmemory (noeviction), but lets a script that has written go on, so
-- retries still settle when Redis is full. The consumer deletes the old
-- entries afterwards (ack.lua), which frees about what the new ones take.
local jobs, i = {}, 3
while i <= #ARGV do
  local n = tonumber(ARGV[i + 5])
  jobs[#jobs + 1] = {id = ARGV[i], delay = tonumber(ARGV[i + 1]), member = ARGV[i + 2], index = KEYS[tonumber(ARGV[i + 3])],
                     err = ARGV[i + 4], first = i + 6, last = i + 5 + n}
  i = i + 6 + n
end
-- One ranged XPENDING over the batch, filtered by this consumer (mine, from
-- ids.lua, put in front of this script), finds what it still owns: each job
-- is owner-checked on its own, and a job listed twice is settled once.
local want = {}
for _, j in ipairs(jobs) do want[j.id] = true end
local got = mine(KEYS[1], ARGV[1], ARGV[2], want)
local owned = {}
for _, j in ipairs(jobs) do
  j.owned = got[j.id] == true
  if j.owned and j.index then
    local cancelling = '10:cancelling' .. #j.id .. ':' .. j.id
    if string.sub(redis.call('GET', j.index) or '', 1, #cancelling) == cancelling then j.owned, j.cancel = false, true end
  end
  if j.owned then
    owned[#owned + 1] = j.id
    got[j.id] = nil
  end
end
local out = {}
if #owned == 0 then
  for k, j in ipairs(jobs) do out[k] = j.cancel and -2 or -1 end
  return out
end
-- Under an ACL that denies a later command, a script fails halfway and keeps
-- what it wrote (the XACK: the jobs would be lost): check first (Redis 7).
if redis.acl_check_cmd and not (redis.acl_check_cmd('XACK', KEYS[1], ARGV[1], owned[1])
    and redis.acl_check_cmd('ZADD', KEYS[2], '0', 'm') and redis.acl_check_cmd('XADD', KEYS[1], '*', 'f', 'v')
    and (#KEYS < 3 or redis.acl_check_cmd('SET', KEYS[3], 'v'))) then
  return redis.error_reply('NOPERM the user may not run XACK, ZADD on the delayed set, XADD on the stream, or SET on the index records')
end
local function rec(...)
  local t = {}
  for _, v in ipairs({...}) do t[#t + 1] = #v .. ':' .. v end
  return table.concat(t)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XACK', KEYS[1], ARGV[1], unpack(owned))
for k, j in ipairs(jobs) do
  if j.cancel then
    out[k] = -2
  elseif not j.owned then
    out[k] = -1
  elseif j.delay > 0 then
    local due = string.format('%.0f', now + j.delay)
    redis.call('ZADD', KEYS[2], due, j.member)
    if j.index then redis.call('SET', j.index, rec('retrying', '', due, '', j.err, '')) end
    out[k] = ''
  else
    out[k] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, j.first, j.last))
    if j.index then redis.call('SET', j.index, rec('waiting', out[k], '', '', '', '')) end
  end
end
return out
