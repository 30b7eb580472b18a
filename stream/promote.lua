-- promote.lua: move due jobs from the delayed set back into the stream.
-- KEYS[1]  stream
-- KEYS[2]  delayed set
-- KEYS[3]  dead-letter stream (for a member that cannot be moved)
-- KEYS[4..] the index records of the tracked jobs the caller expects to be
--          due ({stream}:job:<job id>, stream.JobKey)
-- ARGV[1]  at most this many jobs
-- Returns  {moved, record...}: the number of jobs moved (or set aside), then,
--          when the script stopped at a due tracked job whose record is not
--          in KEYS, the records of the due tracked jobs from there on that are
--          not in KEYS (at most ARGV[1]): call again with them in KEYS.
-- A moved job with track = "1" and a job_id gets its index record
-- (stream/index.go), "waiting" with the new entry ID, at {stream}:job:<job id>
-- ("sha1:" and the ID's SHA-1 for an ID over 128 bytes), a key in the
-- stream's slot. The script writes only records declared in KEYS: it moves
-- the due jobs in order up to the first tracked one whose record is not
-- declared, and returns the names it needs (PromoteDue's second call).
-- A member is "<source id>|" followed by the new entry's field names and
-- values, each written as "<byte length>:<bytes>". Due means score <= Redis
-- TIME, so worker clocks do not matter, and since the move of each job is part
-- of this one script, many consumers promoting at once neither lose nor
-- duplicate a job.
-- A member that does not parse, or has more than 1100 fields (Lua cannot pass
-- more values to one command), is set aside: moved to the dead-letter stream
-- with dead_reason "malformed", so that it cannot fail every later promotion.
-- Every member is parsed before the first write, and the first write is a
-- ZREM: Redis refuses a script's first write that needs memory while it is
-- over maxmemory (noeviction) but lets a script that has written go on, and a
-- move frees about what it adds.
local maxValues = 2200
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local function parse(m)
  local bar = string.find(m, '|', 1, true)
  if not bar then return nil end
  local f, pos = {}, bar + 1
  while pos <= #m do
    if #f == maxValues then return nil end
    local c = string.find(m, ':', pos, true)
    if not c then return nil end
    local n = tonumber(string.sub(m, pos, c - 1))
    if not n or n < 0 or n ~= math.floor(n) or c + n > #m then return nil end
    f[#f + 1] = string.sub(m, c + 1, c + n)
    pos = c + n + 1
  end
  if #f == 0 or #f % 2 ~= 0 then return nil end
  return f
end
local parsed = {}
for i, m in ipairs(due) do parsed[i] = parse(m) or false end
-- The name of a job's index record, stream.JobKey's rule: the stream's hash
-- tag (the stream's name when it has none) then ":job:".
local prefix = '{' .. KEYS[1] .. '}:job:'
local open = string.find(KEYS[1], '{', 1, true)
if open then
  local close = string.find(KEYS[1], '}', open + 1, true)
  if close and close > open + 1 then prefix = KEYS[1] .. ':job:' end
end
local function record(f)
  local on, id = false, nil
  for k = 1, #f, 2 do
    -- The last value of a field counts, as for the decoder (stream.Decode).
    if f[k] == 'track' then on = f[k + 1] == '1'
    elseif f[k] == 'job_id' then id = f[k + 1] end
  end
  if not on or not id or id == '' then return nil end
  if #id > 128 then return prefix .. 'sha1:' .. redis.sha1hex(id) end
  return prefix .. id
end
local declared = {}
for k = 4, #KEYS do declared[KEYS[k]] = true end
-- Move due[1..stop]: up to the first tracked job whose record is undeclared.
local records, stop, need, asked = {}, #due, {}, {}
for i = 1, #due do
  if parsed[i] then
    local r = record(parsed[i])
    if r and not declared[r] then
      if stop == #due then stop = i - 1 end
      if not asked[r] then asked[r] = true; need[#need + 1] = r end
    end
    records[i] = r
  end
end
-- Under an ACL that denies a later command, a script fails halfway and keeps
-- what it wrote: check every command first (Redis 7; nothing to check on
-- servers without ACL checks in scripts).
if stop > 0 and redis.acl_check_cmd then
  if not (redis.acl_check_cmd('ZREM', KEYS[2], 'm') and redis.acl_check_cmd('XADD', KEYS[1], '*', 'f', 'v')
      and redis.acl_check_cmd('XADD', KEYS[3], '*', 'f', 'v')) then
    return redis.error_reply('NOPERM the user may not run ZREM on the delayed set or XADD on the stream or its dead-letter stream')
  end
  for i = 1, stop do
    if records[i] and not redis.acl_check_cmd('SET', records[i], 'v') then
      return redis.error_reply('NOPERM the user may not run SET on the index records')
    end
  end
end
for i = 1, stop do
  local m = due[i]
  redis.call('ZREM', KEYS[2], m)
  if parsed[i] then
    local id = redis.call('XADD', KEYS[1], '*', unpack(parsed[i]))
    if records[i] then redis.call('SET', records[i], '7:waiting' .. #id .. ':' .. id .. '0:0:0:0:') end
  else
    redis.call('XADD', KEYS[3], '*', 'dead_reason', 'malformed', 'dead_error',
      'delayed-set member does not parse, or has more than 1100 fields', 'delayed_member', m,
      'dead_stream', KEYS[1])
  end
end
local out = {stop}
for _, r in ipairs(need) do out[#out + 1] = r end
return out
