-- retry.lua: end this delivery and schedule the job's next attempt.
-- KEYS[1]  stream
-- KEYS[2]  delayed set (sorted set; score = due time, Unix ms by Redis TIME)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  entry ID
-- ARGV[4]  delay, ms
-- ARGV[5]  delayed-set member (the new entry, encoded), used when delay > 0
-- ARGV[6..] the new entry's fields, used when delay <= 0
-- Returns  the new entry's ID ("" when it went to the delayed set), or -1 when
--          this consumer does not own the entry (nothing was written).
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p ~= 1 or p[1][2] ~= ARGV[2] then return -1 end
local id = ''
local delay = tonumber(ARGV[4])
if delay <= 0 then
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 6))
else
  local t = redis.call('TIME')
  local due = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + delay
  redis.call('ZADD', KEYS[2], string.format('%.0f', due), ARGV[5])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
return id
