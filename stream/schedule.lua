-- schedule.lua: put a job in the delayed set, once per enqueue-once marker.
-- KEYS[1]  delayed set
-- KEYS[2]  optional: the job's enqueue-once marker ({stream}:once:<key>),
--          present when ARGV[4] is a window other than "0"
-- KEYS[#KEYS] with ARGV[6] = "1": the job's index record ({stream}:job:<id>,
--          see stream/index.go), set to "scheduled" with the due time
-- ARGV[1]  "at": ARGV[2] is the due time in Unix ms; "in": ARGV[2] is a delay
--          in ms from now by Redis TIME
-- ARGV[2]  time or delay, ms
-- ARGV[3]  member (stream.EncodeDelayed)
-- ARGV[4]  optional: the marker's window in ms, counted from the due time
--          (the marker lives until due + window); "0" for no marker
-- ARGV[5]  optional: the job ID
-- ARGV[6]  optional: "1" when the job is tracked
-- Returns  {due time in Unix ms, job id, duplicate}: duplicate is 1 when
--          the marker existed, and then nothing was written and job id is the
--          first job's (see enqueue.lua for the marker's value).
local marker, index = nil, nil
if ARGV[4] and ARGV[4] ~= '0' then marker = KEYS[2] end
if ARGV[6] == '1' then index = KEYS[#KEYS] end
if redis.acl_check_cmd and not (redis.acl_check_cmd('ZADD', KEYS[1], '0', 'm')
    and (not marker or redis.acl_check_cmd('SET', marker, 'v', 'PX', '1'))
    and (not index or redis.acl_check_cmd('SET', index, 'v'))) then
  return redis.error_reply('NOPERM the user may not run ZADD on the delayed set or SET on the enqueue-once marker or the index record')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = tonumber(ARGV[2])
if ARGV[1] == 'in' then due = now + due end
if marker then
  local first = redis.call('GET', marker)
  if first then
    local sp = string.find(first, ' ', 1, true)
    if sp then first = string.sub(first, sp + 1) end
    return {string.format('%.0f', due), first, 1}
  end
end
local s = string.format('%.0f', due)
redis.call('ZADD', KEYS[1], s, ARGV[3])
if marker then
  local ttl = math.max(due - now, 0) + tonumber(ARGV[4])
  redis.call('SET', marker, '- ' .. ARGV[5], 'PX', string.format('%.0f', ttl))
end
if index then
  local v = {'scheduled', '', s, '', '', ''}
  for i, x in ipairs(v) do v[i] = #x .. ':' .. x end
  redis.call('SET', index, table.concat(v))
end
return {s, ARGV[5] or '', 0}
