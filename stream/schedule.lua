-- schedule.lua: put a job in the delayed set.
-- KEYS[1]  delayed set
-- ARGV[1]  "at": ARGV[2] is the due time in Unix ms; "in": ARGV[2] is a delay
--          in ms from now by Redis TIME
-- ARGV[2]  time or delay, ms
-- ARGV[3]  member (stream.EncodeDelayed)
-- Returns  the due time, Unix ms.
local due = tonumber(ARGV[2])
if ARGV[1] == 'in' then
  local t = redis.call('TIME')
  due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + due
end
due = string.format('%.0f', due)
redis.call('ZADD', KEYS[1], due, ARGV[3])
return due
