-- trim.lua: remove the entries every consumer group has read and acknowledged.
-- KEYS[1]  stream
-- ARGV[1]  keep: entries younger than this many milliseconds (by Redis TIME) stay; 0 keeps none by age
-- Returns  {removed, horizon}: how many entries XTRIM removed and the MINID it used
--          ("" when nothing was trimmed because the stream or its groups are missing).
-- The horizon is, over all groups, the lowest of: the oldest pending entry, and
-- the last delivered entry (kept itself). Nothing unread or pending is removed.

-- IDs are compared as decimal strings, never as Lua numbers: a double cannot
-- hold every 64-bit part of an ID ("1-9007199254740993" would equal
-- "1-9007199254740992"), and such a rounding would trim a pending entry.
-- Redis writes ID parts without leading zeros, so the shorter string is less.
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

if redis.call('EXISTS', KEYS[1]) == 0 then return {0, ''} end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then return {0, ''} end

local horizon = nil
for _, g in ipairs(groups) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local h = last
  local p = redis.call('XPENDING', KEYS[1], name)
  if p[1] > 0 and less(p[2], h) then h = p[2] end
  if horizon == nil or less(h, horizon) then horizon = h end
end

local keep = tonumber(ARGV[1])
if keep > 0 then
  local t = redis.call('TIME')
  local cutoff = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - keep
  if cutoff <= 0 then
    horizon = '0-0' -- keep reaches back before 1970: every entry is young enough to stay
  else
    cutoff = string.format('%.0f', cutoff) .. '-0'
    if less(cutoff, horizon) then horizon = cutoff end
  end
end
return {redis.call('XTRIM', KEYS[1], 'MINID', horizon), horizon}
