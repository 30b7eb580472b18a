-- move.lua: move one dead-lettered entry back to its source stream, if this
-- replay still holds the replay lease.
-- KEYS[1]  dead-letter stream
-- KEYS[2]  source stream
-- KEYS[3]  replay lease key (string: the holder's token)
-- KEYS[4]  replay cursor key (hash)
-- KEYS[5]  optional: the enqueue-once marker of the entry's idempotency key
--          in the source stream's namespace (stream.OnceKey), unless ARGV[4]
--          is 5
-- KEYS[ARGV[4]] optional: the index record of a tracked job
--          ({source}:job:<job id>, stream.JobKey)
-- ARGV[1]  lease token
-- ARGV[2]  dead-letter entry ID
-- ARGV[3]  cursor TTL in milliseconds
-- ARGV[4]  optional: the index in KEYS of the job's index record ("0": none)
-- ARGV[5]  optional: "1" when the caller decoded the entry and found more job
--          fields than stream.MaxFields (it then stays dead: -2)
-- Returns  the new source entry ID; 0 when the entry is no longer in the
--          dead-letter stream (moved or purged before: only the cursor is
--          written); -2 when the entry has more job fields than
--          stream.MaxFields (ARGV[5], or over 1100 fields, more values than
--          one Lua call can pass), so that its copy would be malformed: it stays dead, only the cursor moves past it; -3 when
--          the marker exists and names another job (a job with the same
--          idempotency key was enqueued once since: replaying this one would
--          add the key's job twice within its window): it stays dead, only
--          the cursor moves past it; -1 when the lease is not ours (nothing
--          written); {record}, when the job is tracked and its index record
--          is not KEYS[ARGV[4]]: nothing written, call again with it.
-- The copy keeps the entry's raw fields in order (duplicates and binary values
-- intact) except every dead_* field, attempt (so the job starts again at
-- attempt 0), replayed_from and replay_count, and appends:
--   job_id        the dead_entry_id (or the DLQ entry ID) when the entry has
--                 no non-empty job_id, so the job keeps its identity;
--   created_at    the time of that ID when the entry has none (or "0");
--   replayed_from the dead-letter entry ID;
--   replay_count  one more than the entry's replay_count (absent: 0).
-- A tracked job (track = "1") gets its index record (stream/index.go)
-- rewritten to "waiting" with the new entry ID: {source}:job:<job id>
-- ("sha1:" and the ID's SHA-1 for an ID over 128 bytes), in KEYS[2]'s slot.
-- The script checks that KEYS[ARGV[4]] is that record before it writes.
-- The XADD, the XDEL and the cursor update happen together or not at all:
-- every check comes before the first write, and XADD is the first write.
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -1 end
local e = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #e == 0 then
  redis.call('HSET', KEYS[4], 'last', ARGV[2])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
  return 0
end
local src = e[1][2]
local f = {}
-- Of a name given twice the last value counts, as for the consumer's
-- decoder (docs/wire-format.md): job_id, created_at and track are read so.
local count, origin, job_id, created, track = 0, ARGV[2], nil, nil, nil
for i = 1, #src - 1, 2 do
  local name, v = src[i], src[i + 1]
  if name == 'dead_entry_id' and string.match(v, '^%d+%-%d+$') then origin = v end
  if name == 'replay_count' then
    count = tonumber(v) or 0
    if count ~= count or count < 0 or count > 1e15 then count = 0 end -- NaN, negative or absurd: start over
    count = math.floor(count)
  elseif string.sub(name, 1, 5) ~= 'dead_' and name ~= 'attempt' and name ~= 'replayed_from' then
    if name == 'job_id' then job_id = v end
    if name == 'created_at' then created = v end
    if name == 'track' then track = v end
    f[#f + 1] = name
    f[#f + 1] = v
  end
end
local has_id, has_created = job_id ~= nil and job_id ~= '', created ~= nil and created ~= '0'
track = track == '1'
if #f > 2200 or ARGV[5] == '1' then
  redis.call('HSET', KEYS[4], 'last', ARGV[2])
  redis.call('PEXPIRE', KEYS[4], ARGV[3])
  return -2
end
if not has_id then
  job_id = origin
  f[#f + 1] = 'job_id'
  f[#f + 1] = origin
end
local at = tonumber(ARGV[4] or '0') or 0
local marker = KEYS[5]
if at == 5 then marker = nil end
if marker then
  local first = redis.call('GET', marker)
  if first then
    local sp = string.find(first, ' ', 1, true)
    if sp then first = string.sub(first, sp + 1) end
    if first ~= job_id then
      redis.call('HSET', KEYS[4], 'last', ARGV[2])
      redis.call('PEXPIRE', KEYS[4], ARGV[3])
      return -3
    end
  end
end
if not has_created then
  f[#f + 1] = 'created_at'
  f[#f + 1] = string.match(origin, '^(%d+)')
end
f[#f + 1] = 'replayed_from'
f[#f + 1] = ARGV[2]
f[#f + 1] = 'replay_count'
f[#f + 1] = string.format('%d', count + 1)
local index
if track then
  local prefix = '{' .. KEYS[2] .. '}:job:'
  local open = string.find(KEYS[2], '{', 1, true)
  if open then
    local close = string.find(KEYS[2], '}', open + 1, true)
    if close and close > open + 1 then prefix = KEYS[2] .. ':job:' end
  end
  index = prefix .. job_id
  if #job_id > 128 then index = prefix .. 'sha1:' .. redis.sha1hex(job_id) end
  if at < 5 or KEYS[at] ~= index then return {index} end
  if redis.acl_check_cmd and not redis.acl_check_cmd('SET', index, 'v') then
    return redis.error_reply('NOPERM the user may not run SET on the index record ' .. prefix .. '*')
  end
end
local id = redis.call('XADD', KEYS[2], '*', unpack(f))
redis.call('XDEL', KEYS[1], ARGV[2])
if index then redis.call('SET', index, '7:waiting' .. #id .. ':' .. id .. '0:0:0:0:') end
redis.call('HSET', KEYS[4], 'last', ARGV[2])
redis.call('PEXPIRE', KEYS[4], ARGV[3])
return id
