-- reap.lua: delete consumers that are idle and own no pending entry.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  min idle time, ms
-- ARGV[3]  the calling consumer (never deleted)
-- Returns  the names of the deleted consumers.
-- XGROUP DELCONSUMER drops a consumer's pending entries for good, so the
-- pending check and the delete run in this one script.
local removed = {}
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local name, pending, idle
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1]
    elseif c[i] == 'pending' then pending = c[i + 1]
    elseif c[i] == 'idle' then idle = c[i + 1] end
  end
  if name ~= ARGV[3] and pending == 0 and idle >= tonumber(ARGV[2])
     and #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, name) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    removed[#removed + 1] = name
  end
end
return removed
