-- retry.lua: end these deliveries and schedule each job's next attempt.
-- KEYS[1]  stream
-- KEYS[2]  delayed set (sorted set; score = due time, Unix ms by Redis TIME)
-- KEYS[3..] the index records of the tracked jobs ({stream}:job:<job id>,
--          stream/index.go)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  the lowest of the jobs' entry IDs, ARGV[4] the highest (the
--          client orders them: no comparison of IDs in Lua)
-- ARGV[5..] one group of values per job, in turn:
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
-- Each job's values are read from ARGV where they are used (at[k]: where
-- job k's start), not copied into a table of its own.
local at, want, i = {}, {}, 5
while i <= #ARGV do
  at[#at + 1] = i
  want[ARGV[i]] = true
  i = i + 6 + tonumber(ARGV[i + 5])
end
-- One ranged XPENDING over the batch, filtered by this consumer (mine_range,
-- from ids.lua, put in front of this script), finds what it still owns:
-- each job is owner-checked on its own, and a job listed twice is settled
-- once. out[k] is -1 (not owned), -2 (cancelling) or false (owned: written
-- below).
local got = mine_range(KEYS[1], ARGV[1], ARGV[2], want, ARGV[3], ARGV[4])
local out, owned = {}, {}
for k, a in ipairs(at) do
  local id, x = ARGV[a], tonumber(ARGV[a + 3])
  out[k] = -1
  if got[id] then
    if x > 0 then
      local cancelling = '10:cancelling' .. #id .. ':' .. id
      if string.sub(redis.call('GET', KEYS[x]) or '', 1, #cancelling) == cancelling then out[k] = -2 end
    end
    if out[k] == -1 then
      out[k] = false
      owned[#owned + 1] = id
      got[id] = nil
    end
  end
end
if #owned == 0 then return out end
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
local now
redis.call('XACK', KEYS[1], ARGV[1], unpack(owned))
for k, a in ipairs(at) do
  if out[k] == false then
    local delay, x = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3])
    if delay > 0 then
      if now == nil then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      end
      local due = string.format('%.0f', now + delay)
      redis.call('ZADD', KEYS[2], due, ARGV[a + 2])
      if x > 0 then redis.call('SET', KEYS[x], rec('retrying', '', due, '', ARGV[a + 4], '')) end
      out[k] = ''
    else
      out[k] = redis.call('XADD', KEYS[1], '*', unpack(ARGV, a + 6, a + 5 + tonumber(ARGV[a + 5])))
      if x > 0 then redis.call('SET', KEYS[x], rec('waiting', out[k], '', '', '', '')) end
    end
  end
end
return out
