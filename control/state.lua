-- Read a queue's pauses with the Redis clock (package control). Read-only.
-- KEYS[1] the queue's pause hash ({q}:paused)
-- Returns {seconds, microseconds, field1, value1, ...}: TIME, then HGETALL.
local t = redis.call('TIME')
local out = {t[1], t[2]}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do
  out[#out + 1] = all[i]
end
return out
