-- ops.lua: apply a batch of lock and idempotency-record operations of many
-- callers in one call.
-- KEYS    the keys of the operations, in order: one per operation, two for
--         the fused ones (lock, then record); all in one cluster slot (the
--         batcher groups operations by slot)
-- ARGV    per operation its code, then its arguments (see below); every
--         number is a positive integer of milliseconds, tokens and owners
--         are not empty (op.go builds them; the script does not check)
-- Returns one reply per operation, in order, saying only what the caller
--         does not know (a fence, a status code), so that a reply costs the
--         client as little to parse as it can. An operation that cannot be
--         applied whole gets its error as {message} (an array of one string:
--         go-redis stops reading a reply at an error reply inside it that
--         it types, OOM or NOPERM, and fails every operation of the call)
--         and changes nothing, and the others still run: every command
--         is sent with redis.pcall (a key of another type, a refusal by
--         the ACL or OOM, is that operation's error reply), each operation
--         makes one write or, fused, checks its second write with the ACL
--         before the first. (Redis checks the ACL for every key of KEYS
--         before the script runs: one forbidden key refuses the whole call
--         with NOPERM, nothing written, and the runner sends each
--         operation of that call again alone.)
--         A begin of a record that exists needs no write: over maxmemory,
--         where Redis refuses its SET anyway, the record is read and
--         reported as it is.
--         Under maxmemory Redis refuses a write that needs memory only until
--         the script has written, so the operations that take (la, gb, rb)
--         come first in a call (a call with one after any other operation,
--         or an unknown code, fails whole before any write); over the limit
--         they are refused and write nothing.
--         The others (that finish, release or extend) then first mark the
--         call as written with a PEXPIRE that changes nothing (GT 1 ms), so
--         that their writes still run.
--
-- Locks. A held lock is the string "<fence> <token>" with the lock's TTL; a
-- released lock is the string "<fence>" (a tombstone) kept for the TTL given
-- at release. A fence is max(Redis TIME in microseconds, previous fence + 1),
-- the previous fence being the one the key still holds (held or tombstone).
--   la token ttl        acquire: the new fence (a string), or 0 when held
--   lr value keep       release: if the lock is value ("<fence> <token>"),
--                       leave the tombstone for keep ms: 1, else 0
--   le value ttl        extend: if the lock is value, set its TTL: 1, else 0
--   lt value            PTTL of the lock if it is value, else -3
-- Records. Processing: "p<owner>", the lease as TTL; finished:
-- "<s><n>:<owner><payload>" (s: c completed, f failed; n: owner's length;
-- payload: the result, or the failure reason), the retention as TTL.
--   rb owner lease      begin: 1 when started (the record taken for
--                       owner), else the record as it is: {'in_progress',
--                       owner, ''}, {'completed', owner, result} or
--                       {'failed', owner, reason}
--   rf owner s val ret  finish the caller's processing record (s: c or f):
--                       1 (also when the caller already finished it so), 0
--   rr owner            release (delete) the caller's processing record: 1, 0
--   re owner lease      extend the caller's processing record's lease: 1, 0
--   rx s                forget a finished record of status s: 1, 0
-- Fused (KEYS: the lock, then the record).
--   gb token ttl owner lease
--                       lock and begin: 0 when the lock is held; the
--                       record as it is ({status, owner, payload}, as rb)
--                       without taking the lock when the record exists;
--                       else both taken: the new fence (a string, as la)
--   gf value keep s owner val ret
--                       finish (s: c or f, as rf) or release (s: r, as rr)
--                       the record, then release the lock (as lr): the
--                       record's reply + 2 * the lock's (3: both done)

-- Cost: a redis.call is the main cost of an operation (more for a write with
-- a TTL), then redis.acl_check_cmd and string.format: each operation makes
-- as few calls as it can, checks the ACL only for a second write, and the
-- fence is formatted once per call (and again only after a fence >= now).
local now, nows
local function fence(v)
  if not now then
    local t = redis.pcall('TIME')
    if t.err then -- the ACL forbids TIME
      return nil, t
    end
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    -- Exact as a double below 2^53 (year 2255 in microseconds).
    if now >= 9007199254740992 then
      return nil
    end
    nows = t[1] .. string.sub(tostring(1000000 + tonumber(t[2])), 2)
  end
  local p = v and tonumber(v)
  if p and p >= now then
    if p + 1 >= 9007199254740992 then
      return nil
    end
    return string.format('%.0f', p + 1)
  end
  return nows
end

-- primed: the call has made a write, so that Redis no longer refuses a
-- write for OOM (see the header); prime(k) makes one that changes nothing
-- (refused by the ACL, it leaves the operation's own write to be refused).
local primed = false
local function prime(k)
  if not primed then
    local r = redis.pcall('PEXPIRE', k, 1, 'GT')
    primed = type(r) ~= 'table'
  end
end

-- get returns the string at k (false when absent), or nil and the error
-- reply when k holds another type or the ACL forbids reading it: every
-- command on a key goes through redis.pcall, so that a key another client
-- filled with something else, or that this user may not touch, fails its
-- own operation only, never the call (whose earlier writes would stand yet
-- be reported failed).
local function get(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then
    return nil, v
  end
  return v
end

-- oom reports whether r is Redis's refusal of a write for want of memory.
local function oom(r)
  return type(r) == 'table' and r.err and string.sub(r.err, 1, 3) == 'OOM'
end

-- may checks the ACL for a SET of key.
local function may(key)
  return not redis.acl_check_cmd or redis.acl_check_cmd('SET', key, 'v')
end

local function denied(what)
  return redis.error_reply('NOPERM the user may not write the ' .. what)
end

-- failed returns the error reply of a redis.pcall of a write (the ACL or
-- OOM refused it: nothing written), or nil (written).
local function failed(r)
  if type(r) == 'table' and r.err then
    return r
  end
  primed = true
  return nil
end

local function held(v)
  return v and string.find(v, ' ', 1, true) ~= nil
end

-- parse returns a finished record's status letter, owner and payload.
local function parse(v)
  local c = string.find(v, ':', 2, true)
  local n = c and tonumber(string.sub(v, 2, c - 1))
  if not n then
    return nil
  end
  return string.sub(v, 1, 1), string.sub(v, c + 1, c + n), string.sub(v, c + n + 1)
end

local names = {c = 'completed', f = 'failed'}

local function report(v)
  if string.sub(v, 1, 1) == 'p' then
    return {'in_progress', string.sub(v, 2), ''}
  end
  local s, owner, payload = parse(v)
  if not names[s or ''] then
    return redis.error_reply('ERR idem: record of unknown format')
  end
  return {names[s], owner, payload}
end

-- lock_check returns whether lock k holds value, or nil and the error
-- reply of its read.
local function lock_check(k, value)
  local v, e = get(k)
  if e then
    return nil, e
  end
  return v == value
end

-- lock_release leaves the tombstone of value's fence for keep ms (k holds
-- value: lock_check): 1, or the error reply of a refused write.
local function lock_release(k, value, keep)
  prime(k)
  local r = redis.pcall('SET', k, string.sub(value, 1, string.find(value, ' ', 1, true) - 1), 'PX', keep)
  return failed(r) or 1
end

-- record_check returns 1 if record k is owner's processing record, 2 if it
-- is owner's record finished with status s already, else 0; or the error
-- reply of its read.
local function record_check(k, owner, s)
  local v, e = get(k)
  if e then
    return e
  end
  if v == 'p' .. owner then
    return 1
  end
  if v and string.sub(v, 1, 1) == s then
    local _, o = parse(v)
    if o == owner then
      return 2
    end
  end
  return 0
end

-- record_write finishes (s: c or f) or releases (s: r, a DEL, which OOM
-- never refuses) owner's processing record k (record_check): 1, or the
-- error reply of a refused write.
local function record_write(k, owner, s, val, ret)
  if s == 'r' then
    return failed(redis.pcall('DEL', k)) or 1
  end
  prime(k)
  return failed(redis.pcall('SET', k, s .. #owner .. ':' .. owner .. val, 'PX', ret)) or 1
end

-- begin takes record k for owner (SET NX GET): nil when taken, else the
-- reply to report: the record as it is, or the error reply of a refused
-- write. Over maxmemory Redis refuses the SET even when the record exists
-- and the SET would write nothing: then the record is read and reported
-- (a finished record needs no write), and the refusal stands only for an
-- absent one.
local function begin(k, owner, lease)
  local v = redis.pcall('SET', k, 'p' .. owner, 'NX', 'PX', lease, 'GET')
  if oom(v) then
    local cur, e = get(k)
    if cur then
      return report(cur)
    end
    return e or v
  end
  if type(v) == 'table' and v.err then -- refused
    return v
  end
  if v then
    return report(v)
  end
  return nil
end

local out = {}
local a, ki = 1, 1
local nargv = #ARGV
-- Before any write: every code known, no take after another operation.
local arity = {la = 3, gb = 5, rb = 3, lr = 3, le = 3, lt = 2, gf = 7, rf = 5, rr = 2, re = 3, rx = 2}
local takes = {la = true, gb = true, rb = true}
local taking = true
while a <= nargv do
  local code = ARGV[a]
  if not arity[code] then
    return redis.error_reply('ERR guard: unknown operation')
  end
  if not takes[code] then
    taking = false
  elseif not taking then
    return redis.error_reply('ERR guard: a take after another operation')
  end
  a = a + arity[code]
end
a = 1
while a <= nargv do
  local code = ARGV[a]
  local k = KEYS[ki]
  local r
  if code == 'la' then
    local token, ttl = ARGV[a + 1], ARGV[a + 2]
    a, ki = a + 3, ki + 1
    local v, e = get(k)
    if e then
      r = e
    elseif held(v) then
      r = 0
    else
      local f, fe = fence(v)
      if not f then
        r = fe or redis.error_reply('ERR lockx: fence out of range')
      else
        r = failed(redis.pcall('SET', k, f .. ' ' .. token, 'PX', ttl)) or f
      end
    end
  elseif code == 'lr' then
    local value, keep = ARGV[a + 1], ARGV[a + 2]
    a, ki = a + 3, ki + 1
    local l, e = lock_check(k, value)
    if e then
      r = e
    else
      r = l and lock_release(k, value, keep) or 0
    end
  elseif code == 'gb' then
    local rk = KEYS[ki + 1]
    local token, ttl, owner, lease = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    a, ki = a + 5, ki + 2
    local v, e = get(k)
    if e then
      r = e
    elseif held(v) then
      r = 0
    elseif not may(k) then
      r = denied('lock or the record')
    else
      local f, fe = fence(v)
      if not f then
        r = fe or redis.error_reply('ERR lockx: fence out of range')
      else
        -- The record first: taken only if absent, else reported as it is
        -- (the lock then not taken); the lock's SET, checked above, cannot
        -- fail once the call has written (were it refused all the same, the
        -- record is taken back, so that the refusal writes nothing).
        r = begin(rk, owner, lease)
        if not r then
          primed = true
          local lv = redis.pcall('SET', k, f .. ' ' .. token, 'PX', ttl)
          if type(lv) == 'table' and lv.err then
            redis.pcall('DEL', rk)
            r = lv
          else
            r = f
          end
        end
      end
    end
  elseif code == 'gf' then
    local rk = KEYS[ki + 1]
    local value, keep, s, owner, val, ret = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]
    a, ki = a + 7, ki + 2
    local l, le = lock_check(k, value)
    local c = record_check(rk, owner, s)
    if le then
      r = le
    elseif type(c) == 'table' then
      r = c
    elseif l and c == 1 and not may(k) then
      r = denied('lock')
    else
      -- The record first, then the lock: the lock's SET, checked above,
      -- cannot fail after the record's; alone, a refusal writes nothing.
      local rr = c == 2 and 1 or c
      if c == 1 then
        rr = record_write(rk, owner, s, val, ret)
      end
      local lr = 0
      if l and type(rr) ~= 'table' then
        lr = lock_release(k, value, keep)
      end
      if type(rr) == 'table' then
        r = rr
      elseif type(lr) == 'table' then
        r = lr
      else
        r = rr + 2 * lr
      end
    end
  elseif code == 'rb' then
    local owner, lease = ARGV[a + 1], ARGV[a + 2]
    a, ki = a + 3, ki + 1
    r = begin(k, owner, lease)
    if not r then
      primed = true
      r = 1
    end
  elseif code == 'rf' then
    local owner, s, val, ret = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
    a, ki = a + 5, ki + 1
    if not names[s] then
      r = redis.error_reply('ERR idem: bad finish arguments')
    else
      r = record_check(k, owner, s)
      if type(r) == 'table' then
        -- refused read: r is the error reply
      elseif r == 1 then
        r = record_write(k, owner, s, val, ret)
      elseif r == 2 then
        r = 1
      end
    end
  elseif code == 'rr' then
    a, ki = a + 2, ki + 1
    local v, e = get(k)
    if e then
      r = e
    elseif v ~= 'p' .. ARGV[a - 1] then
      r = 0
    else
      r = record_write(k, ARGV[a - 1], 'r')
    end
  elseif code == 'le' then
    local value, ttl = ARGV[a + 1], ARGV[a + 2]
    a, ki = a + 3, ki + 1
    local v, e = get(k)
    if e then
      r = e
    elseif v ~= value then
      r = 0
    else
      r = redis.pcall('PEXPIRE', k, ttl)
    end
  elseif code == 're' then
    local owner, lease = ARGV[a + 1], ARGV[a + 2]
    a, ki = a + 3, ki + 1
    local v, e = get(k)
    if e then
      r = e
    elseif v ~= 'p' .. owner then
      r = 0
    else
      r = redis.pcall('PEXPIRE', k, lease)
    end
  elseif code == 'lt' then
    a, ki = a + 2, ki + 1
    local v, e = get(k)
    if e then
      r = e
    elseif v == ARGV[a - 1] then
      r = redis.pcall('PTTL', k)
    else
      r = -3
    end
  elseif code == 'rx' then
    local s = ARGV[a + 1]
    a, ki = a + 2, ki + 1
    local v, e = get(k)
    if e then
      r = e
    elseif not names[s] then
      r = redis.error_reply('ERR idem: only a completed or failed record can be forgotten')
    elseif not v or string.sub(v, 1, 1) ~= s then
      r = 0
    else
      r = failed(redis.pcall('DEL', k)) or 1
    end
  end
  if type(r) == 'table' and r.err then
    r = {r.err}
  end
  out[#out + 1] = r
end
return out
