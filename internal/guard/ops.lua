-- ops.lua: apply a batch of lock and idempotency-record operations of many
-- callers in one call.
-- KEYS    the keys of the operations, in order: one per operation, two for
--         the fused ones (lock, then record); all in one cluster slot (the
--         batcher groups operations by slot)
-- ARGV    per operation its code, then its arguments (see below); every
--         number is a positive integer of milliseconds
-- Returns one reply per operation, in order. Each operation checks what can
--         fail (arguments, the ACL) before its first write and then applies
--         all of its writes: one that fails a check gets an error reply of
--         its own and changes nothing, and the others still run. An OOM
--         refusal of the script's first write fails the whole call, which
--         then has written nothing.
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
--   rb owner lease      begin: {'started', owner, ''}, {'in_progress',
--                       owner, ''}, {'completed', owner, result} or
--                       {'failed', owner, reason}
--   rf owner s val ret  finish the caller's processing record (s: c or f):
--                       1 (also when the caller already finished it so), 0
--   rr owner            release (delete) the caller's processing record: 1, 0
--   re owner lease      extend the caller's processing record's lease: 1, 0
--   rx s                forget a finished record of status s: 1, 0
-- Fused (KEYS: the lock, then the record).
--   gb token ttl owner lease
--                       lock and begin: {'locked', '', '', ''} when the lock
--                       is held; the record's {status, owner, payload, ''}
--                       without taking the lock when the record exists;
--                       else both taken: {'started', owner, '', fence}
--   gf value keep s owner val ret
--                       finish (s: c or f, as rf) or release (s: r, as rr)
--                       the record, then release the lock (as lr):
--                       {record reply, lock reply}
local now
local function fence(v)
  if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local f = now
  local p = v and tonumber(v)
  if p and p >= f then
    f = p + 1
  end
  -- Exact as a double below 2^53 (year 2255 in microseconds).
  if f >= 9007199254740992 then
    return nil
  end
  return string.format('%.0f', f)
end

local function num(s)
  local n = tonumber(s)
  if not n or n < 1 or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- may checks the ACL for cmd on key alone (an extra argument of DEL would
-- be another key).
local margs = {SET = 'v', PEXPIRE = '1'}
local function may(cmd, key)
  if not redis.acl_check_cmd then
    return true
  end
  if margs[cmd] then
    return redis.acl_check_cmd(cmd, key, margs[cmd])
  end
  return redis.acl_check_cmd(cmd, key)
end

local function denied(what)
  return redis.error_reply('NOPERM the user may not write the ' .. what)
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
    return {'in_progress', string.sub(v, 2), '', ''}
  end
  local s, owner, payload = parse(v)
  if not names[s or ''] then
    return redis.error_reply('ERR idem: record of unknown format')
  end
  return {names[s], owner, payload, ''}
end

local function lock_release(k, value, keep)
  if redis.call('GET', k) ~= value then
    return 0
  end
  -- PEXPIRE first: a script's first write is what Redis refuses when it is
  -- over maxmemory, and this one needs no memory.
  redis.call('PEXPIRE', k, keep)
  redis.call('SET', k, string.sub(value, 1, string.find(value, ' ', 1, true) - 1), 'KEEPTTL')
  return 1
end

local function record_finish(k, owner, s, val, ret)
  local v = redis.call('GET', k)
  if v == 'p' .. owner then
    redis.call('PEXPIRE', k, ret) -- first, as in lock_release
    redis.call('SET', k, s .. #owner .. ':' .. owner .. val, 'KEEPTTL')
    return 1
  end
  if v and string.sub(v, 1, 1) == s then
    local _, o = parse(v)
    if o == owner then
      return 1
    end
  end
  return 0
end

local function record_release(k, owner)
  if redis.call('GET', k) ~= 'p' .. owner then
    return 0
  end
  redis.call('DEL', k)
  return 1
end

local out = {}
local a, ki = 1, 1
while a <= #ARGV do
  local code = ARGV[a]
  local k = KEYS[ki]
  local r
  if code == 'la' then
    local token, ttl = ARGV[a + 1], num(ARGV[a + 2])
    a, ki = a + 3, ki + 1
    local v = redis.call('GET', k)
    if not ttl or token == '' then
      r = redis.error_reply('ERR lockx: bad acquire arguments')
    elseif held(v) then
      r = 0
    elseif not may('SET', k) then
      r = denied('lock')
    else
      local f = fence(v)
      if not f then
        r = redis.error_reply('ERR lockx: fence out of range')
      else
        redis.call('SET', k, f .. ' ' .. token, 'PX', ttl)
        r = f
      end
    end
  elseif code == 'lr' then
    local value, keep = ARGV[a + 1], num(ARGV[a + 2])
    a, ki = a + 3, ki + 1
    if not keep or not string.find(value, ' ', 1, true) then
      r = redis.error_reply('ERR lockx: bad release arguments')
    elseif not (may('SET', k) and may('PEXPIRE', k)) then
      r = denied('lock')
    else
      r = lock_release(k, value, keep)
    end
  elseif code == 'le' then
    local value, ttl = ARGV[a + 1], num(ARGV[a + 2])
    a, ki = a + 3, ki + 1
    if not ttl then
      r = redis.error_reply('ERR lockx: bad extend arguments')
    elseif redis.call('GET', k) ~= value then
      r = 0
    else
      r = redis.call('PEXPIRE', k, ttl)
    end
  elseif code == 'lt' then
    a, ki = a + 2, ki + 1
    if redis.call('GET', k) == ARGV[a - 1] then
      r = redis.call('PTTL', k)
    else
      r = -3
    end
  elseif code == 'rb' then
    local owner, lease = ARGV[a + 1], num(ARGV[a + 2])
    a, ki = a + 3, ki + 1
    local v = redis.call('GET', k)
    if not lease or owner == '' then
      r = redis.error_reply('ERR idem: bad begin arguments')
    elseif v then
      r = report(v)
    elseif not may('SET', k) then
      r = denied('record')
    else
      redis.call('SET', k, 'p' .. owner, 'PX', lease)
      r = {'started', owner, '', ''}
    end
  elseif code == 'rf' then
    local owner, s, val, ret = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], num(ARGV[a + 4])
    a, ki = a + 5, ki + 1
    if not ret or not names[s] then
      r = redis.error_reply('ERR idem: bad finish arguments')
    elseif not (may('SET', k) and may('PEXPIRE', k)) then
      r = denied('record')
    else
      r = record_finish(k, owner, s, val, ret)
    end
  elseif code == 'rr' then
    a, ki = a + 2, ki + 1
    if not may('DEL', k) then
      r = denied('record')
    else
      r = record_release(k, ARGV[a - 1])
    end
  elseif code == 're' then
    local owner, lease = ARGV[a + 1], num(ARGV[a + 2])
    a, ki = a + 3, ki + 1
    if not lease then
      r = redis.error_reply('ERR idem: bad extend arguments')
    elseif redis.call('GET', k) ~= 'p' .. owner then
      r = 0
    else
      r = redis.call('PEXPIRE', k, lease)
    end
  elseif code == 'rx' then
    local s = ARGV[a + 1]
    a, ki = a + 2, ki + 1
    local v = redis.call('GET', k)
    if not names[s] then
      r = redis.error_reply('ERR idem: only a completed or failed record can be forgotten')
    elseif not v or string.sub(v, 1, 1) ~= s then
      r = 0
    elseif not may('DEL', k) then
      r = denied('record')
    else
      redis.call('DEL', k)
      r = 1
    end
  elseif code == 'gb' then
    local rk = KEYS[ki + 1]
    local token, ttl, owner, lease = ARGV[a + 1], num(ARGV[a + 2]), ARGV[a + 3], num(ARGV[a + 4])
    a, ki = a + 5, ki + 2
    local v = redis.call('GET', k)
    if not ttl or not lease or token == '' or owner == '' then
      r = redis.error_reply('ERR guard: bad lock-and-begin arguments')
    elseif held(v) then
      r = {'locked', '', '', ''}
    else
      local rv = redis.call('GET', rk)
      if rv then
        r = report(rv)
      elseif not (may('SET', k) and may('SET', rk)) then
        r = denied('lock or the record')
      else
        local f = fence(v)
        if not f then
          r = redis.error_reply('ERR lockx: fence out of range')
        else
          redis.call('SET', k, f .. ' ' .. token, 'PX', ttl)
          redis.call('SET', rk, 'p' .. owner, 'PX', lease)
          r = {'started', owner, '', f}
        end
      end
    end
  elseif code == 'gf' then
    local rk = KEYS[ki + 1]
    local value, keep, s, owner, val, ret = ARGV[a + 1], num(ARGV[a + 2]), ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], num(ARGV[a + 6])
    a, ki = a + 7, ki + 2
    if not keep or not ret or not string.find(value, ' ', 1, true) or not (names[s] or s == 'r') then
      r = redis.error_reply('ERR guard: bad finish-and-release arguments')
    elseif not (may('SET', k) and may('PEXPIRE', k) and may('SET', rk) and may('PEXPIRE', rk) and may('DEL', rk)) then
      r = denied('lock or the record')
    else
      local l = lock_release(k, value, keep)
      local rr
      if s == 'r' then
        rr = record_release(rk, owner)
      else
        rr = record_finish(rk, owner, s, val, ret)
      end
      r = {rr, l}
    end
  else
    return redis.error_reply('ERR guard: unknown operation')
  end
  out[#out + 1] = r
end
return out
