-- touch.lua: set the idle time of entries this consumer still owns.
-- KEYS[1]  stream
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  idle time to set, ms: 0 extends visibility (heartbeat); the
--          visibility timeout gives the entry back for the next sweep
-- ARGV[4..] entry IDs
-- Returns  the IDs this consumer no longer owns (reclaimed by another, acked,
--          or deleted from the stream: Redis 7's XCLAIM drops those from the PEL).
-- The owner check matters: XCLAIM with min-idle 0 from a stale worker would
-- take an entry back from its new owner. JUSTID with RETRYCOUNT keeps the
-- delivery count unchanged (on Redis and on miniredis alike).
-- Giving an entry back (idle > 0) also takes one off its delivery count, so
-- that the reclaim that follows leaves it where it was: a job given back
-- unfinished (at shutdown) is not mistaken for one whose worker crashed.
local lost = {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  local count = 0
  if #p == 1 then
    count = p[1][4]
    if tonumber(ARGV[3]) > 0 and count > 0 then count = count - 1 end
  end
  local kept = #p == 1 and p[1][2] == ARGV[2] and
    #redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[3], 'RETRYCOUNT', count, 'JUSTID') == 1
  if not kept then
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
