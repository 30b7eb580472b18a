-- promote.lua: move due jobs from the delayed set back into the stream.
-- KEYS[1]  stream
-- KEYS[2]  delayed set
-- KEYS[3]  dead-letter stream (for a member that does not parse)
-- ARGV[1]  at most this many jobs
-- Returns  the number of jobs moved.
-- A member is "<source id>|" followed by the new entry's field names and
-- values, each written as "<byte length>:<bytes>". Due means score <= Redis
-- TIME, so worker clocks do not matter, and since the move of each job is part
-- of this one script, many consumers promoting at once neither lose nor
-- duplicate a job.
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local function parse(m)
  local bar = string.find(m, '|', 1, true)
  if not bar then return nil end
  local f, pos = {}, bar + 1
  while pos <= #m do
    local c = string.find(m, ':', pos, true)
    if not c then return nil end
    local n = tonumber(string.sub(m, pos, c - 1))
    if not n or c + n > #m then return nil end
    f[#f + 1] = string.sub(m, c + 1, c + n)
    pos = c + n + 1
  end
  if #f == 0 or #f % 2 ~= 0 then return nil end
  return f
end
for _, m in ipairs(due) do
  local f = parse(m)
  if f then
    redis.call('XADD', KEYS[1], '*', unpack(f))
  else
    redis.call('XADD', KEYS[3], '*', 'dead_reason', 'malformed', 'dead_error',
      'delayed-set member does not parse', 'delayed_member', m, 'dead_stream', KEYS[1])
  end
  redis.call('ZREM', KEYS[2], m)
end
return #due
