-- cancel.lua: cancel a tracked job that is scheduled, retrying or waiting,
-- or ask the consumer running it to cancel it.
-- KEYS[1]  stream
-- KEYS[2]  delayed set
-- KEYS[3]  the job's index record ({stream}:job:<job id>, stream/index.go)
-- ARGV[1]  job ID
-- ARGV[2]  time to live of the cancelled record, ms
-- ARGV[3]  at most this many delayed-set members due at the job's due time
--          are read to find the job's (bounded work)
-- ARGV[4]  the queue's control channel ({stream}:control)
-- Returns  {"cancelled", the state it had}; {"unknown"} (no record, or its
--          member or entry is gone); {"finished", state} (done, dead,
--          cancelled: nothing written); {"cancelling", group, consumer}
--          (pending in a group: the record says "cancelling" with the
--          entry and the time, and "cancel <entry ID>" is published on
--          the control channel for the consumer that holds it; asked again,
--          the message is published again).
-- A scheduled or retrying job is removed from the delayed set (found among
-- the members whose score is its due time, by its job_id field); a waiting
-- job, not pending in any group, is deleted from the stream: a consumer
-- reading it either got it before this script (running) or never will. The
-- record then says "cancelled" with the time. Every check comes before the
-- first write, which is the ZREM or XDEL (they free memory, so the script
-- runs while Redis is over maxmemory and then may go on to the SET).
local v = redis.call('GET', KEYS[3])
if not v then return {'unknown'} end
local f, pos = {}, 1
while pos <= #v do
  local c = string.find(v, ':', pos, true)
  if not c then break end
  local n = tonumber(string.sub(v, pos, c - 1))
  if not n then break end
  f[#f + 1] = string.sub(v, c + 1, c + n)
  pos = c + n + 1
end
if #f ~= 6 then return redis.error_reply('ERR cancel.lua: index record does not parse') end
local state = f[1]
if state == 'done' or state == 'dead' or state == 'cancelled' then return {'finished', state} end
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if redis.acl_check_cmd and not (redis.acl_check_cmd('ZREM', KEYS[2], 'm') and redis.acl_check_cmd('XDEL', KEYS[1], '0-1')
    and redis.acl_check_cmd('SET', KEYS[3], 'v', 'PX', '1')) then
  return redis.error_reply('NOPERM the user may not run ZREM on the delayed set, XDEL on the stream, or SET on the index record')
end
-- jobID returns the job_id field of a delayed-set member, nil if none.
local function jobID(m)
  local bar = string.find(m, '|', 1, true)
  if not bar then return nil end
  local p, name = bar + 1, true
  local last
  while p <= #m do
    local c = string.find(m, ':', p, true)
    if not c then return nil end
    local n = tonumber(string.sub(m, p, c - 1))
    if not n then return nil end
    local s = string.sub(m, c + 1, c + n)
    if not name and last == 'job_id' then return s end
    last, name, p = s, not name, c + n + 1
  end
  return nil
end
if state == 'scheduled' or state == 'retrying' then
  local found
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], f[3], f[3], 'LIMIT', 0, tonumber(ARGV[3]))) do
    if jobID(m) == ARGV[1] then found = m break end
  end
  if not found then return {'unknown'} end
  redis.call('ZREM', KEYS[2], found)
elseif state == 'waiting' or state == 'cancelling' then
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
  if not ok then groups = {} end
  for _, g in ipairs(groups) do
    local name
    for i = 1, #g, 2 do if g[i] == 'name' then name = g[i + 1] end end
    local p = redis.call('XPENDING', KEYS[1], name, f[2], f[2], 1)
    if #p == 1 then
      -- A running job. PUBLISH first (a user that may not fails the
      -- script before it writes; the consumer acts after the script); the
      -- SET is the only write, so a refused one (OOM) leaves nothing
      -- written. The record keeps its time to live (none while the job
      -- lives).
      redis.call('PUBLISH', ARGV[4], 'cancel ' .. f[2])
      if state == 'waiting' then
        redis.call('SET', KEYS[3], '10:cancelling' .. #f[2] .. ':' .. f[2] .. '0:' .. #now .. ':' .. now .. '0:0:', 'KEEPTTL')
      end
      return {'cancelling', name, p[1][2]}
    end
  end
  if redis.call('XDEL', KEYS[1], f[2]) == 0 then return {'unknown'} end
else
  return redis.error_reply('ERR cancel.lua: index record has an unknown state')
end
redis.call('SET', KEYS[3], '9:cancelled0:0:' .. #now .. ':' .. now .. '0:0:', 'PX', ARGV[2])
return {'cancelled', state}
