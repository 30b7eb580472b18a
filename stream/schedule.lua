-- schedule.lua: put a job in the delayed set, once per enqueue-once marker.
-- KEYS[1]  delayed set
-- KEYS[2]  optional: the job's enqueue-once marker ({stream}:once:<key>)
-- ARGV[1]  "at": ARGV[2] is the due time in Unix ms; "in": ARGV[2] is a delay
--          in ms from now by Redis TIME
-- ARGV[2]  time or delay, ms
-- ARGV[3]  member (stream.EncodeDelayed)
-- ARGV[4]  with KEYS[2]: the window in ms, counted from the due time (the
--          marker lives until due + window)
-- ARGV[5]  with KEYS[2]: the job ID
-- Returns  {due time in Unix ms, job id, duplicate}: duplicate is 1 when
--          KEYS[2] existed, and then nothing was written and job id is the
--          first job's (see enqueue.lua for the marker's value).
if KEYS[2] and redis.acl_check_cmd and not (redis.acl_check_cmd('ZADD', KEYS[1], '0', 'm')
    and redis.acl_check_cmd('SET', KEYS[2], 'v', 'PX', '1')) then
  return redis.error_reply('NOPERM the user may not run ZADD on the delayed set or SET on the enqueue-once marker')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = tonumber(ARGV[2])
if ARGV[1] == 'in' then due = now + due end
if KEYS[2] then
  local first = redis.call('GET', KEYS[2])
  if first then
    local sp = string.find(first, ' ', 1, true)
    if sp then first = string.sub(first, sp + 1) end
    return {string.format('%.0f', due), first, 1}
  end
end
local s = string.format('%.0f', due)
redis.call('ZADD', KEYS[1], s, ARGV[3])
if KEYS[2] then
  local ttl = math.max(due - now, 0) + tonumber(ARGV[4])
  redis.call('SET', KEYS[2], '- ' .. ARGV[5], 'PX', string.format('%.0f', ttl))
end
return {s, ARGV[5] or '', 0}
