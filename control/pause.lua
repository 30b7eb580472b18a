-- Pause a queue or one of its job types (package control).
-- KEYS[1] the queue's pause hash ({q}:paused)
-- ARGV[1] field: "queue" or "type:<job type>"
-- ARGV[2] end of the pause, Unix ms of the Redis clock; "0": until resumed
-- ARGV[3] the queue's control channel ({q}:control)
-- ARGV[4] the most pauses the hash may hold
-- Returns the Redis time in ms, or an error reply:
--   "PAST <now ms>" when ARGV[2] is not after the Redis clock,
--   "FULL <n>" when the hash holds ARGV[4] pauses already.
-- Everything is checked before the first write. Pauses that have ended are
-- removed (bounded by ARGV[4]).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untilMs = tonumber(ARGV[2])
if untilMs == nil or untilMs < 0 then
  return redis.error_reply('ERR pause end ' .. ARGV[2] .. ' is not a number of milliseconds')
end
if untilMs ~= 0 and untilMs <= now then
  return redis.error_reply('PAST ' .. now)
end
local all = redis.call('HGETALL', KEYS[1])
local ended, live, present = {}, 0, false
for i = 1, #all, 2 do
  local u = tonumber(all[i + 1])
  if all[i] == ARGV[1] then
    present = true
  elseif u ~= nil and u ~= 0 and u <= now then
    ended[#ended + 1] = all[i]
  else
    live = live + 1
  end
end
if not present and live >= tonumber(ARGV[4]) then
  return redis.error_reply('FULL ' .. live)
end
for i = 1, #ended do
  redis.call('HDEL', KEYS[1], ended[i])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], 'pause')
return now
