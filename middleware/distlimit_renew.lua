-- distlimit_renew.lua: extend a lease taken by distlimit_acquire.lua.
-- KEYS[1]  sorted set of the key's holders (see distlimit_acquire.lua)
-- ARGV[1]  holder token
-- ARGV[2]  lease in milliseconds (>= 1)
-- Returns  1 when the lease was extended to now + lease, 0 when the token
--          holds no lease any more (it expired and was removed, or the key
--          was deleted): the holder must stop.
local lease = tonumber(ARGV[2])
if not lease or lease < 1 or lease ~= math.floor(lease) then
  return redis.error_reply('ERR distlimit: lease must be a positive integer')
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'zset' then
  return redis.error_reply('WRONGTYPE distlimit: ' .. KEYS[1] .. ' is a ' .. kind)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  -- Expired: another holder may already have been admitted in its place.
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.max(tonumber(last[2]) - now, 1))
return 1
