-- readown.lua: re-read this consumer's own pending entries (after a restart).
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  read entries with IDs greater than this one ("0" at the start)
-- ARGV[4]  count
-- Returns  {{{id, {field, value, ...}, deliveries}, ...}, {deleted id, ...}}
-- Reading history counts as a delivery. Entries deleted while pending come
-- back without a body: they are acknowledged here and returned as deleted.
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[4], 'STREAMS', KEYS[1], ARGV[3])
local out, deleted = {}, {}
if not r then return {out, deleted} end
for _, e in ipairs(r[1][2]) do
  if e[2] then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
    local n = 0
    if #p == 1 then n = p[1][4] end
    out[#out + 1] = {e[1], e[2], n}
  else
    redis.call('XACK', KEYS[1], ARGV[1], e[1])
    deleted[#deleted + 1] = e[1]
  end
end
return {out, deleted}
