-- reasons.lua: count the newest dead letters of a dead-letter stream by
-- dead_reason, without sending their fields (payloads) to the client.
-- KEYS[1]  dead-letter stream
-- ARGV[1]  at most this many entries, newest first (bounded work per call)
-- Returns  {scanned, reason1, count1, reason2, count2, ...}; an entry
--          without dead_reason counts as "unknown".
-- Read-only: it writes nothing, so it cannot fail half-way through a write.
local n = tonumber(ARGV[1])
local entries = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', n)
local counts, order = {}, {}
for _, e in ipairs(entries) do
  local f = e[2]
  local reason = 'unknown'
  for i = 1, #f, 2 do
    if f[i] == 'dead_reason' then reason = f[i + 1] end
  end
  if reason == '' then reason = 'unknown' end
  if counts[reason] == nil then
    counts[reason] = 0
    order[#order + 1] = reason
  end
  counts[reason] = counts[reason] + 1
end
local out = {#entries}
for _, r in ipairs(order) do
  out[#out + 1] = r
  out[#out + 1] = counts[r]
end
return out
