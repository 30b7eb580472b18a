-- ids.lua: helpers put in front of ack.lua, retry.lua and dead.lua (settle.go).
-- IDs are compared and stepped as decimal strings, never as Lua numbers: a
-- double cannot hold every 64-bit part of an ID.
local function lessnum(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local function less(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if am ~= bm then return lessnum(am, bm) end
  return lessnum(as, bs)
end
local function incr(s)
  for i = #s, 1, -1 do
    local d = string.byte(s, i) - 48
    if d < 9 then return string.sub(s, 1, i - 1) .. string.char(d + 49) .. string.rep('0', #s - i) end
  end
  return '1' .. string.rep('0', #s)
end
local function after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if seq == '18446744073709551615' then return incr(ms) .. '-0' end
  return ms .. '-' .. incr(seq)
end
-- mine_range returns the set of the IDs of want (a set) that consumer owns
-- in group's PEL of stream, all of them between lo and hi (inclusive): one
-- ranged XPENDING from lo to hi, filtered by the consumer, paged by 1000
-- (the range may hold other entries of the consumer), instead of one
-- XPENDING per ID. The client sorted the IDs and gives the range, so the
-- script compares none; a range that misses an ID of want only makes it read
-- as not owned. With want nil, the set holds every ID of the consumer's in
-- [lo, hi].
local function mine_range(stream, group, consumer, want, lo, hi)
  local owned = {}
  local start = lo
  while true do
    local p = redis.call('XPENDING', stream, group, start, hi, 1000, consumer)
    for _, e in ipairs(p) do
      if want == nil or want[e[1]] then owned[e[1]] = true end
    end
    if #p < 1000 or p[#p][1] == hi then break end
    start = after(p[#p][1])
  end
  return owned
end
