-- tick.lua: enqueue one tick's job of a periodic schedule, at most once
-- across every scheduler, never before the tick by the Redis clock (package
-- periodic; docs/wire-format.md, "Periodic jobs").
-- KEYS[1]  the stream
-- KEYS[2]  the tick's marker ({stream}:periodic:tick:<name>:<tick ms>)
-- KEYS[3]  the schedules' records ({stream}:periodic:last, a hash)
-- ARGV[1]  the tick, Unix time in milliseconds
-- ARGV[2]  the tick's tolerance in milliseconds: refused as late from
--          tick + tolerance on
-- ARGV[3]  "1" for a catch-up (policy RunOnce): the tolerance does not
--          apply, but the schedule must have a record older than the tick
-- ARGV[4]  the marker's time to live in milliseconds
-- ARGV[5]  the schedule's name (the record's field)
-- ARGV[6..] the entry's fields, as for XADD (an even count, at most 4000)
-- Returns  {status, now}: now is the Redis time in milliseconds, status
--          'added' (then a third element: the entry ID), 'early' (now is
--          before the tick: nothing written), 'duplicate' (the tick's marker
--          exists: another scheduler added it), 'stale' (the record holds
--          this tick or a later one) or 'late' (past the tolerance; in a
--          catch-up: the schedule has no record).
-- Every check comes before the first write, and the first write is the
-- XADD: under maxmemory (noeviction) Redis refuses it and nothing is
-- written; once it has written, Redis lets the script go on.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tick, tol, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
local nf = #ARGV - 5
if not tick or tick < 0 or tick ~= math.floor(tick) or not tol or tol < 1 or not ttl or ttl < 1
    or (ARGV[3] ~= '0' and ARGV[3] ~= '1') or nf < 2 or nf > 4000 or nf % 2 ~= 0 then
  return redis.error_reply('ERR tick.lua: arguments are not "tick tolerance catch-up ttl name fields..."')
end
if now < tick then
  return {'early', now}
end
if redis.acl_check_cmd then
  if not redis.acl_check_cmd('XADD', KEYS[1], '*', 'f', 'v') then
    return redis.error_reply('NOPERM the user may not run XADD on the stream')
  end
  if not (redis.acl_check_cmd('EXISTS', KEYS[2]) and redis.acl_check_cmd('SET', KEYS[2], 'v', 'PX', '1')) then
    return redis.error_reply('NOPERM the user may not run EXISTS and SET on the tick marker')
  end
  if not (redis.acl_check_cmd('HGET', KEYS[3], 'f') and redis.acl_check_cmd('HSET', KEYS[3], 'f', 'v')) then
    return redis.error_reply('NOPERM the user may not run HGET and HSET on the schedule records')
  end
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {'duplicate', now}
end
local st = redis.call('TYPE', KEYS[1])['ok']
local rt = redis.call('TYPE', KEYS[3])['ok']
if (st ~= 'stream' and st ~= 'none') or (rt ~= 'hash' and rt ~= 'none') then
  return redis.error_reply('WRONGTYPE tick.lua: the stream or the schedule records hold the wrong kind of value')
end
local last = redis.call('HGET', KEYS[3], ARGV[5])
-- A record is a tick's Unix ms: digits only, at most 15 (a float such as
-- "inf" or "1e400" written by something else would hold every tick back
-- forever). Anything else counts as no record, and is overwritten.
if last and not (string.match(last, '^%d+$') and #last <= 15) then
  last = false
end
last = last and tonumber(last)
if last and last >= tick then
  return {'stale', now}
end
if ARGV[3] == '1' then
  if not last then
    return {'late', now}
  end
elseif now >= tick + tol then
  return {'late', now}
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 6))
redis.call('SET', KEYS[2], id, 'PX', ttl)
redis.call('HSET', KEYS[3], ARGV[5], ARGV[1])
return {'added', now, id}
