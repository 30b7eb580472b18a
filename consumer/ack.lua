-- ack.lua: acknowledge finished jobs that this consumer still owns, and delete
-- settled entries that no consumer group still needs.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  "1": delete settled entries that every group has settled; "0": keep them
-- ARGV[4]  n: the number of entry IDs to acknowledge
-- KEYS[2..1+t]  the index records of the tracked jobs among them
--               ({stream}:job:<job id>, stream/index.go)
-- ARGV[5]  t: the number of tracked jobs
-- ARGV[6]  the time to live of a done job's record, ms
-- ARGV[7]  the lowest of the entry IDs to acknowledge ("" when n = 0)
-- ARGV[8]  the highest of them ("" when n = 0)
-- ARGV[9..8+3t] for each tracked job, in KEYS order: its entry ID, the
--               state of its record ("done", or "cancelled" for a job
--               cancelled by an operator) and the result its handler
--               recorded ("" for none)
-- then, from b = 9+3t:
-- ARGV[b..b-1+n]  entry IDs to acknowledge (finished jobs), each once
-- ARGV[b+n..]   with ARGV[3] "1": candidates for deletion, entries this
--               consumer has settled since its last trim (acknowledged, or
--               settled with another script: retry, dead-letter); the
--               consumer sends them only when its last trim found settled
--               entries piled up (see below), and none otherwise
-- Returns  {acked, {id owned by another consumer, ...}, {id no longer pending, ...}, deleted,
--          piled: 1 when the trim found more than 1000 settled entries above the horizon, else 0}
-- The caller passes lo and hi (it sorts the IDs), so that acknowledging
-- compares no IDs (less, string.match on both, cost more than the XACK);
-- IDs out of order cost a Lua table, never an ownership check, and an ID
-- outside [lo, hi] is reported, not acknowledged.
-- A tracked job this call acknowledges gets its record "done" (or
-- "cancelled"), with the time and its result, for ARGV[6] ms: that SET comes after the XACK, so it
-- needs no room under maxmemory (see below).
-- XACK itself is not consumer-scoped: a stale worker whose job was reclaimed
-- would acknowledge the new owner's delivery. One ranged XPENDING over the
-- batch's IDs, filtered by this consumer, finds what it still owns.
-- An entry is deleted only when every group has read it (its
-- last-delivered-id is not lower) and none holds it pending, so nothing a
-- group has not settled is ever deleted. Mostly by a cheap MINID trim below
-- the oldest entry any group still needs; when that horizon is held back (a
-- job running for hours, a lagging group) and settled entries pile up above
-- it, by XDEL of the settled entries themselves, so that one long job holds
-- only its own entry (and about 1000 settled ones, plus what each consumer
-- settled since its last trim), never all the entries after it.
-- Only XACK and XDEL write, and neither needs memory: this script works while
-- Redis is over maxmemory (the records of tracked jobs are written after the
-- XACK, and Redis lets a script that has written go on).

-- less, after and mine_range come from ids.lua, put in front of this script.

local n, t = tonumber(ARGV[4]), tonumber(ARGV[5])
local b = 9 + 3 * t
-- The consumer's pending entries in [lo, hi]. Mostly they are exactly the
-- batch (all: every ID is owned, no table of IDs is built); otherwise the IDs of
-- the batch among them are owned, and each of the others is either pending
-- under another consumer (stale) or not pending (gone).
local all, owned, stale, gone, acked = false, {}, {}, {}, 0
if n > 0 then
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[7], ARGV[8], 1000, ARGV[2])
  all = #p == n
  for i = 1, #p do
    if not all then break end
    all = p[i][1] == ARGV[b - 1 + i]
  end
  if not all then
    local got = {}
    if #p < 1000 then
      for _, e in ipairs(p) do got[e[1]] = true end
    else
      got = mine_range(KEYS[1], ARGV[1], ARGV[2], nil, ARGV[7], ARGV[8])
    end
    for i = b, b - 1 + n do
      local id = ARGV[i]
      if got[id] then
        owned[#owned + 1] = id
      elseif #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) == 1 then
        stale[#stale + 1] = id
      else
        gone[#gone + 1] = id
      end
    end
  end
end
if t > 0 and redis.acl_check_cmd and not redis.acl_check_cmd('SET', KEYS[2], 'v', 'PX', '1') then
  return redis.error_reply('NOPERM the user may not run SET on the index records of tracked jobs')
end
if all then
  acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, b, b - 1 + n))
elseif #owned > 0 then
  acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(owned))
end
if t > 0 and acked > 0 then
  local ours
  if not all then
    ours = {}
    for _, id in ipairs(owned) do ours[id] = true end
  end
  local tm = redis.call('TIME')
  local now = string.format('%.0f', tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000))
  for k = 1, t do
    local id, st, res = ARGV[6 + 3 * k], ARGV[7 + 3 * k], ARGV[8 + 3 * k]
    if all or ours[id] then
      redis.call('SET', KEYS[1 + k], #st .. ':' .. st .. '0:0:' .. #now .. ':' .. now .. '0:' .. #res .. ':' .. res, 'PX', ARGV[6])
    end
  end
end

local deleted, piled = 0, 0
if ARGV[3] == '1' then
  -- The horizon: below it, every group has read and settled every entry.
  -- A cheap approximate MINID trim removes the whole stream nodes below it.
  local horizon, busy, others = nil, 0, {}
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local name, last, lag, pending
    for i = 1, #g, 2 do
      local k = g[i]
      if k == 'name' then name = g[i + 1]
      elseif k == 'last-delivered-id' then last = g[i + 1]
      elseif k == 'lag' then lag = g[i + 1]
      elseif k == 'pending' then pending = g[i + 1] end
    end
    if name ~= ARGV[1] then others[#others + 1] = {name, last} end
    local h = after(last)
    if pending > 0 then
      local p = redis.call('XPENDING', KEYS[1], name, '-', '+', 1)
      if #p == 1 and less(p[1][1], h) then h = p[1][1] end
    end
    if horizon == nil or less(h, horizon) then horizon = h end
    if type(lag) ~= 'number' then busy = math.huge else busy = math.max(busy, lag + pending) end
  end
  if horizon then
    deleted = redis.call('XTRIM', KEYS[1], 'MINID', '~', horizon)
    -- The approximate trim keeps a node that holds an entry at or above the
    -- horizon, even a deleted one (an XDEL by another client): on a stream
    -- left with at most about one node, an exact trim removes the settled
    -- entries below the horizon too (at most ~100, so it stays cheap).
    if redis.call('XLEN', KEYS[1]) <= 100 then deleted = deleted + redis.call('XTRIM', KEYS[1], 'MINID', horizon) end
  end
  -- Settled entries above the horizon stay until it passes them, unless
  -- something holds it back (a job pending for long, a lagging group):
  -- when more than 1000 such entries have piled up, settled entries are
  -- deleted one by one, if every other group has read them and none holds
  -- them pending; the reply says so (piled), and the consumer then sends
  -- its candidates with its next trims.
  if horizon and redis.call('XLEN', KEYS[1]) - busy > 1000 then
    piled = 1
    -- The candidates: what this call acknowledged, and those sent.
    local cand = {}
    if all then
      for i = b, #ARGV do cand[#cand + 1] = ARGV[i] end
    else
      for _, id in ipairs(owned) do cand[#cand + 1] = id end
      for i = b + n, #ARGV do cand[#cand + 1] = ARGV[i] end
    end
    local del = {}
    for _, id in ipairs(cand) do
      local free = not less(id, horizon)
      for _, g in ipairs(others) do
        if not free then break end
        if less(g[2], id) or #redis.call('XPENDING', KEYS[1], g[1], id, id, 1) == 1 then free = false end
      end
      if free then del[#del + 1] = id end
    end
    if #del > 0 then deleted = deleted + redis.call('XDEL', KEYS[1], unpack(del)) end
  end
end
return {acked, stale, gone, deleted, piled}
