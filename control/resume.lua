-- Resume a queue or one of its job types (package control).
-- KEYS[1] the queue's pause hash ({q}:paused)
-- ARGV[1] field to remove ("queue" or "type:<job type>"); "" removes every pause
-- ARGV[2] the queue's control channel ({q}:control)
-- Returns the number of pauses removed that had not ended yet by the Redis
-- clock (ended ones are removed too, not counted).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function live(v)
  local u = tonumber(v)
  return u == nil or u == 0 or u > now
end
local n = 0
if ARGV[1] == '' then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 2, #all, 2 do
    if live(all[i]) then n = n + 1 end
  end
  redis.call('DEL', KEYS[1])
else
  local v = redis.call('HGET', KEYS[1], ARGV[1])
  if v then
    if live(v) then n = 1 end
    redis.call('HDEL', KEYS[1], ARGV[1])
  end
end
redis.call('PUBLISH', ARGV[2], 'resume')
return n
