-- distlimit_acquire.lua: take a lease on one of a key's Limit slots.
-- KEYS[1]  sorted set of the key's holders: member = holder token, score =
--          lease expiry in Redis TIME milliseconds
-- ARGV[1]  holder token (unique per acquisition)
-- ARGV[2]  limit: how many holders at once (>= 1)
-- ARGV[3]  lease in milliseconds (>= 1)
-- Returns  {1, 0} when the lease was taken (or the token already held one,
--          which is renewed), or {0, ms} when all slots are held; ms is
--          how long until the first lease expires.
-- Expired holders (score <= now) are removed first, so a crashed holder's
-- slot frees itself when its lease runs out: there is no counter to drift.
local limit = tonumber(ARGV[2])
local lease = tonumber(ARGV[3])
if not limit or limit < 1 or limit ~= math.floor(limit) then
  return redis.error_reply('ERR distlimit: limit must be a positive integer')
end
if not lease or lease < 1 or lease ~= math.floor(lease) then
  return redis.error_reply('ERR distlimit: lease must be a positive integer')
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE distlimit: ' .. KEYS[1] .. ' is a ' .. kind)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held and redis.call('ZCARD', KEYS[1]) >= limit then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, math.max(tonumber(first[2]) - now, 1)}
end
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], math.max(tonumber(last[2]) - now, 1))
return {1, 0}
