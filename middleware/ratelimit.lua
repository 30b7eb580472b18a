-- ratelimit.lua: one GCRA (generic cell rate algorithm) decision, as in
-- go-redis/redis_rate, timed by Redis TIME so worker clocks do not matter.
-- KEYS[1]  the key's theoretical arrival time (TAT), a string of
--          microseconds since the Unix epoch; it expires when the key is
--          idle again
-- ARGV[1]  burst: how many requests may pass at once after idle (>= 1)
-- ARGV[2]  emission interval: microseconds between requests at the steady
--          rate (>= 1)
-- Returns  {1, 0} when the request is allowed (the TAT is advanced), or
--          {0, retry_after_us} when it is limited (nothing is written).
local burst = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
if not burst or burst < 1 or burst ~= math.floor(burst) then
  return redis.error_reply('ERR ratelimit: burst must be a positive integer')
end
if not interval or interval < 1 or interval ~= math.floor(interval) then
  return redis.error_reply('ERR ratelimit: interval must be a positive integer')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = now
local stored = redis.call('GET', KEYS[1])
if stored then
  local v = tonumber(stored)
  if v and v > now then
    tat = v
  end
end
local new_tat = tat + interval
-- The request may pass if new_tat is at most burst intervals ahead of now.
local allow_at = new_tat - burst * interval
if now < allow_at then
  return {0, allow_at - now}
end
local ttl_ms = math.ceil((new_tat - now) / 1000)
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.max(ttl_ms, 1))
return {1, 0}
