-- Check, without running any of them, that the user running this script may
-- run what fencekit's scripts and waiters run (Backend.Check). It reads,
-- writes and publishes nothing.
-- KEYS[1] a lease key, KEYS[2] its token counter, KEYS[3] a tombstone (all
-- under the backend's prefix, none ever used: the name is reserved for the
-- check). ARGV[1] the release channel; ARGV[2] "classic" for PUBLISH and
-- SUBSCRIBE instead of SPUBLISH and SSUBSCRIBE.
-- Returns "" when every command is allowed (or the server has no
-- redis.acl_check_cmd: Redis before 7.0), else the denied ones,
-- separated by ", ".
if not redis.acl_check_cmd then
  return ''
end
local denied = {}
local function check(...)
  local ok, allowed = pcall(redis.acl_check_cmd, ...)
  if ok and not allowed then
    denied[#denied + 1] = string.upper((...))
  end
end
check('eval', 'return 0', '3', KEYS[1], KEYS[2], KEYS[3])
check('get', KEYS[1])
check('set', KEYS[1], 'v', 'NX', 'PX', '1')
check('pexpire', KEYS[1], '1')
check('pttl', KEYS[1])
check('del', KEYS[1])
check('get', KEYS[2])
check('set', KEYS[2], '1')
check('exists', KEYS[3])
check('get', KEYS[3])
check('set', KEYS[3], 'v', 'PX', '1')
check('pexpire', KEYS[3], '1')
check('time')
if ARGV[2] == 'classic' then
  check('publish', ARGV[1], 'released')
  check('subscribe', ARGV[1])
else
  check('spublish', ARGV[1], 'released')
  check('ssubscribe', ARGV[1])
end
-- One entry per command, in the order checked.
local seen, out = {}, {}
for _, c in ipairs(denied) do
  if not seen[c] then
    seen[c] = true
    out[#out + 1] = c
  end
end
return table.concat(out, ', ')
