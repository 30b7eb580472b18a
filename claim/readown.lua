-- readown.lua: re-read this consumer's own pending entries (after a restart).
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  read entries with IDs greater than this one ("0" at the start)
-- ARGV[4]  count
-- ARGV[5]  size limit, bytes (0: none); ARGV[6] fields and ARGV[7] bytes
--          kept of an entry over it (oversize.lua, put in front)
-- Returns  {{{id, {field, value, ...}, deliveries}, ...}, {deleted id, ...}};
--          an entry over the size limit is {id, {field, value, ...} cut
--          short, deliveries, size, longest field, fields left out}, and an entry
--          larger than the limit only by the earlier values of names it gives
--          again comes with one value per name, its last (oversize.lua)
-- Reading history counts as a delivery. Entries deleted while pending come
-- back without a body: they are acknowledged here and returned as deleted.
-- With a size limit, entries are read one at a time and the reading stops
-- once those handed over add up to the limit (as in reclaim.lua): the next
-- call goes on after the last entry returned.
local want, limit = tonumber(ARGV[4]), tonumber(ARGV[5])
local step = want
if limit > 0 then step = 1 end
local after, out, deleted, sent = ARGV[3], {}, {}, 0
for _ = 1, want do
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', step, 'STREAMS', KEYS[1], after)
  local es = (r and r[1][2]) or {}
  for _, e in ipairs(es) do
    after = e[1]
    if e[2] then
      local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
      local n = 0
      if #p == 1 then n = p[1][4] end
      local x, b = handed(e[1], e[2], n, limit, tonumber(ARGV[6]), tonumber(ARGV[7]))
      out[#out + 1] = x
      sent = sent + b
    else
      redis.call('XACK', KEYS[1], ARGV[1], e[1])
      deleted[#deleted + 1] = e[1]
    end
  end
  if step == want or #es < step or #out + #deleted >= want or sent >= limit then break end
end
return {out, deleted}
