-- oversize.lua: an entry over the consumer's size limit is handed over cut
-- short, so that a reply never carries it whole: a reply slower than the
-- client's ReadTimeout fails every time, and the entry and those claimed
-- with it would never settle. Put in front of reclaim.lua and readown.lua.
-- cut(f, limit, keepFields, keepBytes): nil for an entry (f: names and
-- values in order) within limit (or limit 0), else {size, field, fields,
-- left}:
--   size   its size as stream.DecodeFields counts it: each name once, with
--          its last value, #name + #value
--   field  the name of its longest last value, the smallest name (in byte
--          order, as Go compares) among equals, cut to keepBytes:
--          stream.OversizeError's field
--   fields what its dead letter records (consumer/deadletter.go): every
--          field in order when there are at most keepFields, else one per
--          name (its last value), the first keepFields names in the order
--          they first come; each name and value cut to keepBytes
--   left   the fields left out
-- The work is bounded by the entry, which Redis holds already; an entry
-- within the limit costs one pass adding up lengths.
local function less(a, b)
  local n = math.min(#a, #b)
  local i = 1
  while i <= n do
    local j = math.min(i + 255, n)
    local x, y = string.sub(a, i, j), string.sub(b, i, j)
    if x ~= y then
      for k = 1, #x do
        local p, q = string.byte(x, k), string.byte(y, k)
        if p ~= q then return p < q end
      end
    end
    i = j + 1
  end
  return #a < #b
end

-- bytes(f): the bytes of the names and values f holds.
local function bytes(f)
  local n = 0
  for i = 1, #f do n = n + #f[i] end
  return n
end

local function cut(f, limit, keepFields, keepBytes)
  if limit <= 0 then return nil end
  local raw = bytes(f)
  if raw <= limit then return nil end
  local last, size, field, longest = {}, 0, nil, -1
  for i = #f - 1, 1, -2 do
    local name, v = f[i], f[i + 1]
    if last[name] == nil then
      last[name] = v
      size = size + #name + #v
      if #v > longest or (#v == longest and less(name, field)) then
        field, longest = name, #v
      end
    end
  end
  if size <= limit then return nil end
  field = string.sub(field, 1, keepBytes)
  local out, n = {}, #f / 2
  if n <= keepFields then
    for i = 1, #f do out[i] = string.sub(f[i], 1, keepBytes) end
    return {size, field, out, 0}
  end
  local taken = {}
  for i = 1, #f, 2 do
    local name = f[i]
    if #out >= 2 * keepFields then break end
    if not taken[name] then
      taken[name] = true
      out[#out + 1] = string.sub(name, 1, keepBytes)
      out[#out + 1] = string.sub(last[name], 1, keepBytes)
    end
  end
  return {size, field, out, n - #out / 2}
end
