-- dead.lua: move a job this consumer owns to the dead-letter stream.
-- KEYS[1]  stream
-- KEYS[2]  dead-letter stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  entry ID
-- ARGV[4]  reason
-- ARGV[5]  error text
-- ARGV[6]  attempts made
-- ARGV[7]  dead-letter stream bound (MAXLEN ~), 0 for none
-- ARGV[8]  n: the number of ARGV values that follow as replacements
-- ARGV[9..8+n] field/value pairs that replace the entry's own in the copy
--          (redaction by the dead-letter middleware)
-- ARGV[9+n..] the entry's fields as the consumer read them, used only when the
--          entry is no longer in the stream (trimmed while pending)
-- Returns  {dead-letter entry ID, entries trimmed from the dead-letter stream},
--          or -1 when this consumer does not own the entry (nothing written).
-- The dead-letter entry holds the original entry's raw fields, as read from
-- the stream (duplicates and binary values intact), followed by dead_reason,
-- dead_error, dead_at (Unix ms, Redis clock), dead_attempts, dead_consumer,
-- dead_entry_id and dead_stream.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p ~= 1 or p[1][2] ~= ARGV[2] then return -1 end
local n = tonumber(ARGV[8])
local replace = {}
for i = 9, 8 + n, 2 do replace[ARGV[i]] = ARGV[i + 1] end
local src = {}
local e = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
if #e == 1 then src = e[1][2] else for i = 9 + n, #ARGV do src[#src + 1] = ARGV[i] end end
local ours = {dead_reason = 1, dead_error = 1, dead_at = 1, dead_attempts = 1,
              dead_consumer = 1, dead_entry_id = 1, dead_stream = 1}
local f = {}
for i = 1, #src - 1, 2 do
  local name = src[i]
  if not ours[name] then
    f[#f + 1] = name
    if replace[name] ~= nil then f[#f + 1] = replace[name] else f[#f + 1] = src[i + 1] end
  end
end
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local meta = {'dead_reason', ARGV[4], 'dead_error', ARGV[5], 'dead_at', now, 'dead_attempts', ARGV[6],
              'dead_consumer', ARGV[2], 'dead_entry_id', ARGV[3], 'dead_stream', KEYS[1]}
for _, v in ipairs(meta) do f[#f + 1] = v end
local id = redis.call('XADD', KEYS[2], '*', unpack(f))
local trimmed = 0
if tonumber(ARGV[7]) > 0 then trimmed = redis.call('XTRIM', KEYS[2], 'MAXLEN', '~', ARGV[7]) end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
return {id, trimmed}
