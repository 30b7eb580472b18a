-- enqueue.lua: add jobs to the stream, each job that has an enqueue-once
-- marker at most once while its marker lives (Producer with
-- ProducerConfig.EnqueueOnce; docs/wire-format.md, "Enqueue once").
-- KEYS[1]    stream
-- KEYS[2..]  the markers of the keyed jobs ({stream}:once:<idempotency key>)
-- ARGV[1]    MAXLEN ~ for XADD, "0" for none
-- ARGV[2]    the marker's time to live in milliseconds (the window)
-- ARGV[3]    n, the number of jobs
-- then, for each job:
--   marker   the index in KEYS of its marker, "0" for a job without one
--   job id   the job's ID (written to the marker)
--   m        the number of field names and values that follow
--   m values the entry's fields, as for XADD (m is even, at most 4000:
--            Lua cannot pass many more values to one command)
-- Returns    for each job {entry id, job id, duplicate}: a job added has its
--            new entry ID, its own job ID and 0; a job whose marker existed
--            adds nothing and has the first job's entry ID ("" while that job
--            waits in the delayed set), the first job's ID and 1.
-- A job with the field track = "1" and a job ID gets its index record
-- (stream/index.go), "waiting" with its entry ID, at {stream}:job:<job id>
-- ("sha1:" and the ID's SHA-1 for an ID over 128 bytes): the script derives
-- that name from KEYS[1] as stream.KeysFor does, so that callers of the
-- layout above need no change; the key is in the stream's slot.
-- A marker is a string "<entry id> <job id>" ("- <job id>" for a scheduled
-- job) with the window as its time to live; a marker without a space (a
-- plain SET by another client) is a job ID alone.
-- Every command is checked before the first write, and the first write is an
-- XADD: under maxmemory (noeviction) Redis refuses it and the script has
-- written nothing; once it has written, Redis lets it go on.
local n = tonumber(ARGV[3])
if not n or n < 0 or n ~= math.floor(n) then
  return redis.error_reply('ERR enqueue.lua: job count ' .. tostring(ARGV[3]) .. ' is not a count')
end
local maxlen = ARGV[1]
if redis.acl_check_cmd then
  if not redis.acl_check_cmd('XADD', KEYS[1], '*', 'f', 'v') then
    return redis.error_reply('NOPERM the user may not run XADD on the stream')
  end
  for k = 2, #KEYS do
    if not (redis.acl_check_cmd('GET', KEYS[k]) and redis.acl_check_cmd('SET', KEYS[k], 'v', 'PX', '1')) then
      return redis.error_reply('NOPERM the user may not run GET and SET on the enqueue-once marker ' .. KEYS[k])
    end
  end
end
-- Parse everything before the first write.
local jobs, pos = {}, 4
for i = 1, n do
  local k, id, m = tonumber(ARGV[pos]), ARGV[pos + 1], tonumber(ARGV[pos + 2])
  if not k or not id or not m or k < 0 or k == 1 or k > #KEYS or m < 2 or m > 4000 or m % 2 ~= 0 or pos + 2 + m > #ARGV then
    return redis.error_reply('ERR enqueue.lua: job ' .. i .. ' is not "marker job-id m values..."')
  end
  local track = false
  for f = pos + 3, pos + 2 + m, 2 do
    if ARGV[f] == 'track' and ARGV[f + 1] == '1' then track = true end
  end
  jobs[i] = {k, id, pos + 3, pos + 2 + m, track}
  pos = pos + 3 + m
end
local function rec(...)
  local t = {}
  for _, v in ipairs({...}) do t[#t + 1] = #v .. ':' .. v end
  return table.concat(t)
end
-- The prefix of the index records: stream.KeysFor's rule.
local prefix = '{' .. KEYS[1] .. '}:job:'
local open = string.find(KEYS[1], '{', 1, true)
if open then
  local close = string.find(KEYS[1], '}', open + 1, true)
  if close and close > open + 1 then prefix = KEYS[1] .. ':job:' end
end
local function jobkey(id)
  if #id > 128 then return prefix .. 'sha1:' .. redis.sha1hex(id) end
  return prefix .. id
end
for _, j in ipairs(jobs) do
  if j[5] and redis.acl_check_cmd and not redis.acl_check_cmd('SET', jobkey(j[2]), 'v') then
    return redis.error_reply('NOPERM the user may not run SET on the index records ' .. prefix .. '*')
  end
end
local out = {}
for i, j in ipairs(jobs) do
  local first = false
  if j[1] > 0 then first = redis.call('GET', KEYS[j[1]]) end
  if first then
    local sp = string.find(first, ' ', 1, true)
    if sp then
      local entry = string.sub(first, 1, sp - 1)
      if entry == '-' then entry = '' end
      out[i] = {entry, string.sub(first, sp + 1), 1}
    else
      out[i] = {'', first, 1}
    end
  else
    local id
    if maxlen ~= '0' then
      id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', unpack(ARGV, j[3], j[4]))
    else
      id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, j[3], j[4]))
    end
    if j[1] > 0 then redis.call('SET', KEYS[j[1]], id .. ' ' .. j[2], 'PX', ARGV[2]) end
    if j[5] and j[2] ~= '' then redis.call('SET', jobkey(j[2]), rec('waiting', id, '', '', '', '')) end
    out[i] = {id, j[2], 0}
  end
end
return out
