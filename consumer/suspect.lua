-- suspect.lua: count the start of a redelivered job (a suspect), or say that
-- it must run alone, or that it has crashed its worker too often to run again.
-- KEYS[1]  stream
-- KEYS[2]  the entry's crash counter (a string key with a TTL)
-- ARGV[1]  group
-- ARGV[2]  consumer
-- ARGV[3]  entry ID
-- ARGV[4]  the most counted runs that may end without a settlement (Config.MaxCrashes)
-- ARGV[5]  the counter's time to live, ms
-- ARGV[6]  "shared": the job would run beside others; "alone": it would run alone
-- KEYS[3]  (a tracked job only) its index record ({stream}:job:<job id>)
-- Returns  {0, 3}: its record says "cancelling" for this entry (an operator
--                  cancelled it while another consumer ran it): do not run
--                  it, settle it as cancelled (nothing written);
--          {runs, 1}: run it (this is its runs-th counted run);
--          {runs, 2}: it has a counted run already: run it alone instead;
--          {runs, 0}: do not run it: runs counted runs ended without a
--                     settlement (its worker stopped): dead-letter it;
--          -1 when this consumer does not own the entry (nothing written).
-- A counter is deleted when its job settles, so a count left over means that
-- the job's worker stopped while running it. A job's first counted run may be
-- shared with other jobs; every later one runs alone, so an innocent job that
-- only ran beside a job that crashed the worker has at most one count.
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p ~= 1 or p[1][2] ~= ARGV[2] then return -1 end
if KEYS[3] then
  local want = '10:cancelling' .. #ARGV[3] .. ':' .. ARGV[3]
  if string.sub(redis.call('GET', KEYS[3]) or '', 1, #want) == want then return {0, 3} end
end
local runs = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if runs >= tonumber(ARGV[4]) then return {runs, 0} end
if runs > 0 and ARGV[6] ~= 'alone' then return {runs, 2} end
redis.call('SET', KEYS[2], runs + 1, 'PX', ARGV[5])
return {runs + 1, 1}
