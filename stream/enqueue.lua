-- enqueue.lua: add jobs to the stream, each job that has an enqueue-once
-- marker at most once while its marker lives (Producer with
-- ProducerConfig.EnqueueOnce; docs/wire-format.md, "Enqueue once"), and
-- write the index record of each tracked job (ProducerConfig.Track).
-- KEYS[1]    stream
-- KEYS[2..]  in any order: the markers of the keyed jobs
--            ({stream}:once:<idempotency key>) and the index records of the
--            tracked jobs ({stream}:job:<job id>, stream.JobKey)
-- ARGV[1]    MAXLEN ~ for XADD, "0" for none
-- ARGV[2]    the marker's time to live in milliseconds (the window)
-- ARGV[3]    n, the number of jobs
-- then, for each job:
--   marker   the index in KEYS of its marker, "0" for a job without one
--   job id   the job's ID (written to the marker and the index record)
--   m        the number of field names and values that follow
--   m values the entry's fields, as for XADD (m is even, at most 4000:
--            Lua cannot pass many more values to one command)
-- Returns    for each job {entry id, job id, duplicate}: a job added has its
--            new entry ID, its own job ID and 0; a job whose marker existed
--            adds nothing and has the first job's entry ID ("" while that job
--            waits in the delayed set), the first job's ID and 1.
-- A job with the field track = "1" (the last value of a field counts, as
-- for the decoder) must have a job_id field equal to its job id (else the
-- call is refused, having written nothing) and gets its index record
-- (stream/index.go), "waiting" with its entry ID, at {stream}:job:<job id>
-- ("sha1:" and the ID's SHA-1 for an ID over 128 bytes). That key must be in
-- KEYS: the script checks that each tracked job's record is declared and
-- refuses the call, having written nothing, when one is not.
-- A marker is a string "<entry id> <job id>" ("- <job id>" for a scheduled
-- job) with the window as its time to live; a marker without a space (a
-- plain SET by another client) is a job ID alone.
-- Every command is checked, and every marker read, before the first write,
-- and the first write is an XADD: under maxmemory (noeviction) Redis refuses
-- it and the script has written nothing; once it has written, Redis lets it
-- go on. So the script's error replies (OOM, NOPERM, WRONGTYPE: a marker or
-- the stream of another type, "ERR enqueue.lua: ...") all come before any
-- write (stream/once.go relies on it).
local n = tonumber(ARGV[3])
if not n or n < 0 or n ~= math.floor(n) then
  return redis.error_reply('ERR enqueue.lua: job count ' .. tostring(ARGV[3]) .. ' is not a count')
end
local maxlen = ARGV[1]
-- Parse everything before the first write.
local jobs, pos = {}, 4
for i = 1, n do
  local k, id, m = tonumber(ARGV[pos]), ARGV[pos + 1], tonumber(ARGV[pos + 2])
  if not k or not id or not m or k < 0 or k == 1 or k > #KEYS or m < 2 or m > 4000 or m % 2 ~= 0 or pos + 2 + m > #ARGV then
    return redis.error_reply('ERR enqueue.lua: job ' .. i .. ' is not "marker job-id m values..."')
  end
  -- The last value of a field counts, as for the decoder (stream.Decode).
  local track, field_id = false, nil
  for f = pos + 3, pos + 2 + m, 2 do
    if ARGV[f] == 'track' then track = ARGV[f + 1] == '1'
    elseif ARGV[f] == 'job_id' then field_id = ARGV[f + 1] end
  end
  if track and (id == '' or field_id ~= id) then
    return redis.error_reply('ERR enqueue.lua: job ' .. i .. ' is tracked but its job_id field is missing or is not its job id')
  end
  jobs[i] = {k, id, pos + 3, pos + 2 + m, track}
  pos = pos + 3 + m
end
local function rec(...)
  local t = {}
  for _, v in ipairs({...}) do t[#t + 1] = #v .. ':' .. v end
  return table.concat(t)
end
-- The name of a job's index record, stream.JobKey's rule: the stream's hash
-- tag (the stream's name when it has none) then ":job:".
local prefix = '{' .. KEYS[1] .. '}:job:'
local open = string.find(KEYS[1], '{', 1, true)
if open then
  local close = string.find(KEYS[1], '}', open + 1, true)
  if close and close > open + 1 then prefix = KEYS[1] .. ':job:' end
end
local declared = {}
for k = 2, #KEYS do declared[KEYS[k]] = true end
for i, j in ipairs(jobs) do
  if j[5] then
    local key = prefix .. j[2]
    if #j[2] > 128 then key = prefix .. 'sha1:' .. redis.sha1hex(j[2]) end
    if not declared[key] then
      return redis.error_reply('ERR enqueue.lua: job ' .. i .. ' is tracked but its index record is not in KEYS')
    end
    j[6] = key
  end
end
if redis.acl_check_cmd then
  if not redis.acl_check_cmd('XADD', KEYS[1], '*', 'f', 'v') then
    return redis.error_reply('NOPERM the user may not run XADD on the stream')
  end
  for _, j in ipairs(jobs) do
    if j[1] > 0 and not (redis.acl_check_cmd('GET', KEYS[j[1]]) and redis.acl_check_cmd('SET', KEYS[j[1]], 'v', 'PX', '1')) then
      return redis.error_reply('NOPERM the user may not run GET and SET on the enqueue-once marker ' .. KEYS[j[1]])
    end
    if j[6] and not redis.acl_check_cmd('SET', j[6], 'v') then
      return redis.error_reply('NOPERM the user may not run SET on the index record ' .. j[6])
    end
  end
end
-- Read the markers before the first write (a marker of another type fails
-- here); set marks those this call writes, for a key twice in the batch.
for _, j in ipairs(jobs) do
  if j[1] > 0 then j[7] = redis.call('GET', KEYS[j[1]]) end
end
local set, out = {}, {}
for i, j in ipairs(jobs) do
  local first = false
  if j[1] > 0 then first = set[KEYS[j[1]]] or j[7] end
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
    if j[1] > 0 then
      set[KEYS[j[1]]] = id .. ' ' .. j[2]
      redis.call('SET', KEYS[j[1]], set[KEYS[j[1]]], 'PX', ARGV[2])
    end
    if j[6] then redis.call('SET', j[6], rec('waiting', id, '', '', '', '')) end
    out[i] = {id, j[2], 0}
  end
end
return out
