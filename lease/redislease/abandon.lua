-- End whatever grant the owner ARGV[1] holds (any token), wake the waiters
-- if that ends one, and remember the owner as ended, so that its acquire
-- request, if it reaches Redis later, is refused (acquire.lua).
-- KEYS[1] the lease; KEYS[2] the owner's tombstone
-- ("<prefix>{<name>}:ended:<owner>"). ARGV[1] the owner; ARGV[2] the
-- release channel; ARGV[3] the tombstone's life in milliseconds
-- (lease.EndedOwnerTTL); notice, the command that publishes, as in
-- release.lua.
-- With KEYS[3] and KEYS[4] (the line and the places, see acquire.lua), the
-- owner also leaves the line, and the waiters are woken if it was first
-- while the name was free: the next one is first now.
-- Returns 1 when it ended a grant, 0 when the owner held none.
-- The tombstone is written first: whatever follows, the owner is ended.
redis.call('SET', KEYS[2], 'abandoned', 'PX', ARGV[3])
local wake = false
if KEYS[4] then
  wake = redis.call('ZRANK', KEYS[3], ARGV[1]) == 0 and redis.call('EXISTS', KEYS[1]) == 0
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
end
local _, owner = string.match(redis.call('GET', KEYS[1]) or '', '^(%d+):(.*)$')
if owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  wake = true
end
if not wake then
  return 0
end
if type(redis.pcall(notice, ARGV[2], 'released')) == 'table' and notice ~= 'PUBLISH' then
  redis.pcall('PUBLISH', ARGV[2], 'released')
end
if owner == ARGV[1] then
  return 1
end
return 0
