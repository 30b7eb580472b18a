-- reclaim.lua: take over entries idle longer than the visibility timeout.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  consumer that takes the entries
-- ARGV[3]  min idle time, ms (the visibility timeout)
-- ARGV[4]  cursor ("0-0" starts a new pass)
-- ARGV[5]  count (the free worker slots)
-- ARGV[6]  size limit, bytes (0: none); ARGV[7] fields and ARGV[8] bytes
--          kept of an entry over it (oversize.lua, put in front)
-- Returns  {next cursor, {{id, {field, value, ...}, deliveries}, ...}, {deleted id, ...}};
--          an entry over the size limit is {id, {field, value, ...} cut
--          short, deliveries, size, longest field, fields left out}, and an entry
--          larger than the limit only by the earlier values of names it gives
--          again comes with one value per name, its last (oversize.lua)
-- XAUTOCLAIM runs without JUSTID so that every reclaim counts as a delivery:
-- a job that kills its worker every time is recognised by its delivery count.
-- Deleted ids are entries trimmed or XDELed while pending; Redis 7 has already
-- removed them from the pending-entries list.
-- With a size limit, the entries are claimed one at a time and the claiming
-- stops once those handed over add up to the limit: a reply carries less
-- than the limit plus one entry (itself within the limit, or cut), so that
-- entries of a few megabytes each, claimed together, cannot make every
-- reply too slow for the client's ReadTimeout. Either way at most count
-- XAUTOCLAIM calls scan at most 10 * count entries, as one call of COUNT
-- count would.
local want, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local step = want
if limit > 0 then step = 1 end
local cursor, out, deleted, sent = ARGV[4], {}, {}, 0
for _ = 1, want do
  local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], cursor, 'COUNT', step)
  cursor = r[1]
  for _, e in ipairs(r[2]) do
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
    local n = 0
    if #p == 1 then n = p[1][4] end
    if e[2] then
      local x, b = handed(e[1], e[2], n, limit, tonumber(ARGV[7]), tonumber(ARGV[8]))
      out[#out + 1] = x
      sent = sent + b
    else
      out[#out + 1] = {e[1], e[2], n}
    end
  end
  for _, d in ipairs(r[3] or {}) do deleted[#deleted + 1] = d end
  if step == want or cursor == '0-0' or #out >= want or sent >= limit then break end
end
return {cursor, out, deleted}
