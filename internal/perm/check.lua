-- check.lua: which of the given commands may the calling user not send?
-- KEYS[1]  a key of the caller's queue: it routes the script to that key's
--          node (Redis Cluster) and must itself be allowed. No key is read or
--          written.
-- ARGV     the commands, one after the other, each as its number of
--          arguments followed by its arguments (command name first)
-- Returns  -1 when the server cannot tell (no redis.acl_check_cmd: Redis
--          older than 7, miniredis); otherwise the 1-based positions of the
--          commands the user may not send: n when ACL denies it (the command
--          or one of its keys), -n when the server does not know the command
--          (renamed, or too old).
if not redis.acl_check_cmd then return -1 end
local denied, i, n = {}, 1, 0
while i <= #ARGV do
  n = n + 1
  local c = tonumber(ARGV[i])
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(ARGV, i + 1, i + c))
  if not ok then
    denied[#denied + 1] = -n
  elseif not allowed then
    denied[#denied + 1] = n
  end
  i = i + c + 1
end
return denied
