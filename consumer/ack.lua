-- ack.lua: acknowledge finished jobs that this consumer still owns.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  the lowest of the entry IDs
-- ARGV[4]  the highest of the entry IDs
-- ARGV[5..] entry IDs
-- Returns  {acked, not-owned id, ...}
-- XACK itself is not consumer-scoped: a stale worker whose job was reclaimed
-- would acknowledge the new owner's delivery. One ranged XPENDING over the
-- batch's IDs, filtered by this consumer, finds what it still owns.
local function after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. string.format('%.0f', tonumber(seq) + 1)
end
local want, n = {}, 0
for i = 5, #ARGV do want[ARGV[i]] = true end
local owned = {}
local start, last = ARGV[3], ARGV[4]
while true do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], start, last, 1000, ARGV[2])
  for _, e in ipairs(p) do
    if want[e[1]] then
      owned[#owned + 1] = e[1]
      want[e[1]] = nil
    end
  end
  if #p < 1000 then break end
  start = after(p[#p][1])
end
if #owned > 0 then n = redis.call('XACK', KEYS[1], ARGV[1], unpack(owned)) end
local out = {n}
for i = 5, #ARGV do
  if want[ARGV[i]] then out[#out + 1] = ARGV[i] end
end
return out
