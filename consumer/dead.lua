-- dead.lua: move a job this consumer owns to the dead-letter stream.
-- KEYS[1]  stream
-- KEYS[2]  dead-letter stream
-- KEYS[3]  optional: the job's index record ({stream}:job:<job id>,
--          stream/index.go), set to "dead" with the time and
--          "<reason>: <error>" for ARGV[10] ms
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  entry ID
-- ARGV[4]  reason
-- ARGV[5]  error text
-- ARGV[6]  attempts made
-- ARGV[7]  dead-letter stream bound (exact MAXLEN), 0 for none
-- ARGV[8]  "copy": copy the entry's fields from the stream; "record:<size>":
--          record the fields given below instead (an oversize entry of size
--          bytes, each value cut short by the consumer, so that it is not
--          copied whole), with dead_truncated set to size
-- ARGV[9]  n: the number of ARGV values that follow as field/value pairs to set
--          in the copy (replacing the entry's own: redaction, the final error
--          history; added when the entry has no such field)
-- ARGV[10] the time to live of the index record in ms (used with KEYS[3])
-- ARGV[11..10+n] those pairs
-- ARGV[11+n..] the entry's fields: with "record", or with "copy" when an
--          earlier call returned -2 (the entry is no longer in the stream)
-- Returns  {dead-letter entry ID, entries trimmed from the dead-letter stream},
--          -1 when this consumer does not own the entry (nothing written), or
--          -2 when the entry is gone from the stream and ARGV has no fields
--          (nothing written: call again with the fields).
-- The dead-letter entry holds the original entry's raw fields, copied here on
-- the server from the stream (duplicates and binary values intact, the payload
-- never travels through the client again), at most 1100 of them (stream.MaxFields,
-- the format's own and a margin; the rest are counted in dead_dropped_fields), followed by dead_reason, dead_error, dead_at
-- (Unix ms, Redis clock), dead_attempts, dead_consumer, dead_entry_id and
-- dead_stream. Every check comes before the first write, which is the XACK, so
-- the script settles while Redis is over maxmemory (see retry.lua).
local maxFields = 1100
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p ~= 1 or p[1][2] ~= ARGV[2] then return -1 end
local n = tonumber(ARGV[9])
local set, order = {}, {}
for i = 11, 10 + n, 2 do
  if set[ARGV[i]] == nil then order[#order + 1] = ARGV[i] end
  set[ARGV[i]] = ARGV[i + 1]
end
local src
local e = {}
if ARGV[8] == 'copy' then e = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3]) end
local truncated = string.match(ARGV[8], '^record:(%d+)$')
if #e == 1 then
  src = e[1][2]
elseif #ARGV > 10 + n then
  src = {}
  for i = 11 + n, #ARGV do src[#src + 1] = ARGV[i] end
else
  return -2
end
local ours = {dead_reason = 1, dead_error = 1, dead_at = 1, dead_attempts = 1, dead_consumer = 1,
              dead_entry_id = 1, dead_stream = 1, dead_dropped_fields = 1, dead_truncated = 1}
local f, copied, dropped, done = {}, 0, 0, {}
for i = 1, #src - 1, 2 do
  local name = src[i]
  if not ours[name] then
    if copied < maxFields then
      copied = copied + 1
      f[#f + 1] = name
      if set[name] ~= nil then
        f[#f + 1] = set[name]
        done[name] = true
      else
        f[#f + 1] = src[i + 1]
      end
    else
      dropped = dropped + 1
    end
  end
end
for _, name in ipairs(order) do
  if not done[name] and not ours[name] then
    f[#f + 1] = name
    f[#f + 1] = set[name]
  end
end
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local meta = {'dead_reason', ARGV[4], 'dead_error', ARGV[5], 'dead_at', now, 'dead_attempts', ARGV[6],
              'dead_consumer', ARGV[2], 'dead_entry_id', ARGV[3], 'dead_stream', KEYS[1]}
if truncated then
  meta[#meta + 1] = 'dead_truncated'
  meta[#meta + 1] = truncated
end
if dropped > 0 then
  meta[#meta + 1] = 'dead_dropped_fields'
  meta[#meta + 1] = tostring(dropped)
end
for _, v in ipairs(meta) do f[#f + 1] = v end
-- Under an ACL that denies a later command, a script fails halfway and keeps
-- what it wrote (the XACK: the job would be lost): check first (Redis 7).
if redis.acl_check_cmd and not (redis.acl_check_cmd('XACK', KEYS[1], ARGV[1], ARGV[3])
    and redis.acl_check_cmd('XADD', KEYS[2], '*', 'f', 'v')
    and (tonumber(ARGV[7]) == 0 or redis.acl_check_cmd('XTRIM', KEYS[2], 'MAXLEN', '=', '1'))
    and (not KEYS[3] or redis.acl_check_cmd('SET', KEYS[3], 'v', 'PX', '1'))) then
  return redis.error_reply('NOPERM the user may not run XACK, or XADD or XTRIM on the dead-letter stream, or SET on the index record')
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
local id = redis.call('XADD', KEYS[2], '*', unpack(f))
if KEYS[3] then
  local why = ARGV[4] .. ': ' .. ARGV[5]
  redis.call('SET', KEYS[3], '4:dead0:0:' .. #now .. ':' .. now .. #why .. ':' .. why .. '0:', 'PX', ARGV[10])
end
local trimmed = 0
if tonumber(ARGV[7]) > 0 then trimmed = redis.call('XTRIM', KEYS[2], 'MAXLEN', '=', ARGV[7]) end
return {id, trimmed}
