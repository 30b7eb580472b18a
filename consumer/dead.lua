-- dead.lua: move jobs this consumer owns to the dead-letter stream, one call
-- per batch (see reschedule.go).
-- KEYS[1]  stream
-- KEYS[2]  dead-letter stream
-- KEYS[3..] the index records of the tracked jobs among them
--          ({stream}:job:<job id>, stream/index.go), each set to "dead" with
--          the time and "<reason>: <error>" for ARGV[4] ms
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  dead-letter stream bound (exact MAXLEN), 0 for none
-- ARGV[4]  the time to live of an index record in ms
-- ARGV[5]  the lowest of the jobs' entry IDs, ARGV[6] the highest (the
--          client orders them: no comparison of IDs in Lua)
-- ARGV[7]  the most fields a dead letter holds of its entry (the rest are
--          counted in dead_dropped_fields)
-- ARGV[8..] one group of values per job, in turn:
--          entry ID; reason; error text; attempts made;
--          mode: "copy": copy the entry's fields from the stream;
--          "record:<size>": record the fields given instead (an oversize
--          entry of size bytes, each value cut short by the consumer, so that
--          it is not copied whole), with dead_truncated set to size;
--          k: the index in KEYS of the job's index record, 0 for none;
--          n: the number of values that follow as field/value pairs to set
--          in the copy (replacing the entry's own: redaction, the final error
--          history; added when the entry has no such field);
--          m: the number of values after those: the entry's fields, with
--          "record", or with "copy" when an earlier call returned -2 for it
--          (the entry is no longer in the stream);
--          left: how many fields of the entry the client left out of the m
--          values (it sends at most as many as are copied), counted in
--          dead_dropped_fields when the fields come from ARGV;
--          the n values, then the m values
-- Returns  {entries trimmed from the dead-letter stream, then per job in
--          order: its dead-letter entry ID, -1 when this consumer does not
--          own the entry (nothing written for it), or -2 when the entry is
--          gone from the stream and ARGV has no fields for it (nothing
--          written for it: call again with the fields)}.
-- A dead-letter entry holds the original entry's raw fields, copied here on
-- the server from the stream (duplicates and binary values intact, the payload
-- never travels through the client again), at most ARGV[7] of them (1100: stream.MaxFields,
-- the format's own and a margin; beyond that one value per name, the last,
-- and the fields not copied are counted in dead_dropped_fields), followed by dead_reason, dead_error, dead_at
-- (Unix ms, Redis clock), dead_attempts, dead_consumer, dead_entry_id and
-- dead_stream. Every check (ownership with one ranged XPENDING, the copies,
-- the ACL) comes before the first write, which is the XACK of every job it
-- settles, so the script settles while Redis is over maxmemory (see
-- retry.lua), and a call that fails has written nothing. The bound is
-- trimmed once, after the batch's entries were added.
local maxFields = tonumber(ARGV[7])
local jobs, i = {}, 8
while i <= #ARGV do
  local n, m = tonumber(ARGV[i + 6]), tonumber(ARGV[i + 7])
  jobs[#jobs + 1] = {id = ARGV[i], reason = ARGV[i + 1], err = ARGV[i + 2], attempts = ARGV[i + 3], mode = ARGV[i + 4],
                     index = KEYS[tonumber(ARGV[i + 5])], left = tonumber(ARGV[i + 8]), set0 = i + 9, n = n,
                     src0 = i + 9 + n, m = m}
  i = i + 9 + n + m
end
-- mine_range comes from ids.lua, put in front of this script; a job listed
-- twice is settled once.
local want = {}
for _, j in ipairs(jobs) do want[j.id] = true end
local got = mine_range(KEYS[1], ARGV[1], ARGV[2], want, ARGV[5], ARGV[6])
local ours = {dead_reason = 1, dead_error = 1, dead_at = 1, dead_attempts = 1, dead_consumer = 1,
              dead_entry_id = 1, dead_stream = 1, dead_dropped_fields = 1, dead_truncated = 1}
local out, settle, index = {0}, {}, false
for k, j in ipairs(jobs) do
  out[k + 1] = -1
  if got[j.id] then
    got[j.id] = nil
    local src, left = nil, 0
    local e = {}
    if j.mode == 'copy' then e = redis.call('XRANGE', KEYS[1], j.id, j.id) end
    if #e == 1 then
      src = e[1][2]
    elseif j.m > 0 then
      src, left = {}, j.left
      for a = j.src0, j.src0 + j.m - 1 do src[#src + 1] = ARGV[a] end
    end
    if src == nil then
      out[k + 1] = -2
    else
      local set, order = {}, {}
      for a = j.set0, j.set0 + j.n - 1, 2 do
        if set[ARGV[a]] == nil then order[#order + 1] = ARGV[a] end
        set[ARGV[a]] = ARGV[a + 1]
      end
      -- The fields to copy: the entry's (but ours), or, when there are more
      -- than maxFields, one value per name (the last, the one the decoder
      -- reads), the names in the order they first come, so that a valid
      -- job with many duplicates keeps what it decodes to.
      local fields, n = src, 0
      for a = 1, #src - 1, 2 do
        if not ours[src[a]] then n = n + 1 end
      end
      if n > maxFields then
        local names, last = {}, {}
        for a = 1, #src - 1, 2 do
          local name = src[a]
          if not ours[name] then
            if last[name] == nil then names[#names + 1] = name end
            last[name] = src[a + 1]
          end
        end
        fields = {}
        for _, name in ipairs(names) do
          fields[#fields + 1] = name
          fields[#fields + 1] = last[name]
        end
      end
      local f, copied, done = {}, 0, {}
      for a = 1, #fields - 1, 2 do
        local name = fields[a]
        if not ours[name] and copied < maxFields then
          copied = copied + 1
          f[#f + 1] = name
          if set[name] ~= nil then
            f[#f + 1] = set[name]
            done[name] = true
          else
            f[#f + 1] = fields[a + 1]
          end
        end
      end
      local dropped = left + n - copied
      for _, name in ipairs(order) do
        if not done[name] and not ours[name] then
          f[#f + 1] = name
          f[#f + 1] = set[name]
        end
      end
      j.f, j.dropped, j.truncated = f, dropped, string.match(j.mode, '^record:(%d+)$')
      settle[#settle + 1] = j
      if j.index then index = j.index end
    end
  end
end
if #settle == 0 then return out end
-- Under an ACL that denies a later command, a script fails halfway and keeps
-- what it wrote (the XACK: the jobs would be lost): check first (Redis 7).
if redis.acl_check_cmd and not (redis.acl_check_cmd('XACK', KEYS[1], ARGV[1], settle[1].id)
    and redis.acl_check_cmd('XADD', KEYS[2], '*', 'f', 'v')
    and (tonumber(ARGV[3]) == 0 or redis.acl_check_cmd('XTRIM', KEYS[2], 'MAXLEN', '=', '1'))
    and (not index or redis.acl_check_cmd('SET', index, 'v', 'PX', '1'))) then
  return redis.error_reply('NOPERM the user may not run XACK, or XADD or XTRIM on the dead-letter stream, or SET on the index record')
end
local ids = {}
for _, j in ipairs(settle) do ids[#ids + 1] = j.id end
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
for k, j in ipairs(jobs) do
  if j.f then
    local f = j.f
    local meta = {'dead_reason', j.reason, 'dead_error', j.err, 'dead_at', now, 'dead_attempts', j.attempts,
                  'dead_consumer', ARGV[2], 'dead_entry_id', j.id, 'dead_stream', KEYS[1]}
    if j.truncated then
      meta[#meta + 1] = 'dead_truncated'
      meta[#meta + 1] = j.truncated
    end
    if j.dropped > 0 then
      meta[#meta + 1] = 'dead_dropped_fields'
      meta[#meta + 1] = tostring(j.dropped)
    end
    for _, v in ipairs(meta) do f[#f + 1] = v end
    out[k + 1] = redis.call('XADD', KEYS[2], '*', unpack(f))
    if j.index then
      local why = j.reason .. ': ' .. j.err
      redis.call('SET', j.index, '4:dead0:0:' .. #now .. ':' .. now .. #why .. ':' .. why .. '0:', 'PX', ARGV[4])
    end
  end
end
if tonumber(ARGV[3]) > 0 then out[1] = redis.call('XTRIM', KEYS[2], 'MAXLEN', '=', ARGV[3]) end
return out
