-- oversize.lua: what a reply hands over of an entry: an entry over the
-- consumer's size limit cut short, and no entry larger than the limit
-- whole, so that a reply never carries one: a reply slower than the
-- client's ReadTimeout fails every time, and the entry and those claimed
-- with it would never settle. Put in front of reclaim.lua and readown.lua.
-- hand(f, limit, keepFields, keepBytes) returns the fields to hand over of
-- an entry (f: names and values in order), and nil or, for an entry over
-- the limit, {size, field, left}:
--   within limit (or limit 0), counting every name and value: f itself;
--   within it only as stream.DecodeFields counts (each name once, with its
--          last value): one value per name, its last, in the order of those
--          last values (what decoding reads; the earlier values of a name
--          given again, which would carry the entry past the limit, are
--          left out);
--   over it: size, its size as stream.DecodeFields counts it; field, the
--          name of its longest last value, the smallest name (in byte
--          order, as Go compares) among equals, cut to keepBytes:
--          stream.OversizeError's field; the fields handed over are what
--          its dead letter records (consumer/deadletter.go): every field in
--          order when there are at most keepFields, else one per name (its
--          last value), the first keepFields names in the order they first
--          come; each name and value cut to keepBytes; left, the fields
--          left out.
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

local function hand(f, limit, keepFields, keepBytes)
  if limit <= 0 or bytes(f) <= limit then return f, nil end
  local lastAt, size, field, longest = {}, 0, nil, -1
  for i = #f - 1, 1, -2 do
    local name, v = f[i], f[i + 1]
    if lastAt[name] == nil then
      lastAt[name] = i
      size = size + #name + #v
      if #v > longest or (#v == longest and less(name, field)) then
        field, longest = name, #v
      end
    end
  end
  local out = {}
  if size <= limit then
    for i = 1, #f, 2 do
      if lastAt[f[i]] == i then
        out[#out + 1] = f[i]
        out[#out + 1] = f[i + 1]
      end
    end
    return out, nil
  end
  field = string.sub(field, 1, keepBytes)
  local n = #f / 2
  if n <= keepFields then
    for i = 1, #f do out[i] = string.sub(f[i], 1, keepBytes) end
    return out, {size, field, 0}
  end
  local taken = {}
  for i = 1, #f, 2 do
    local name = f[i]
    if #out >= 2 * keepFields then break end
    if not taken[name] then
      taken[name] = true
      out[#out + 1] = string.sub(name, 1, keepBytes)
      out[#out + 1] = string.sub(f[lastAt[name] + 1], 1, keepBytes)
    end
  end
  return out, {size, field, n - #out / 2}
end

-- handed(id, f, n, limit, keepFields, keepBytes) returns the reply element
-- of entry id (fields f, delivery count n) as hand gives it, {id, fields,
-- n} or, cut short, {id, fields, n, size, field, left}, and the bytes of
-- the names and values it hands over (the reply budget's count).
local function handed(id, f, n, limit, keepFields, keepBytes)
  local kept, over = hand(f, limit, keepFields, keepBytes)
  if over then
    return {id, kept, n, over[1], over[2], over[3]}, bytes(kept)
  end
  return {id, kept, n}, bytes(kept)
end
