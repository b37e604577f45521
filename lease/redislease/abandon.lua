-- End whatever grant the owner ARGV[1] holds (any token), wake the waiters
-- if that ends one, and remember the owner as ended, so that its acquire
-- request, if it reaches Redis later, is refused (acquire.lua).
-- KEYS[1] the lease; KEYS[2] the owner's tombstone
-- ("<prefix>{<name>}:ended:<owner>"). ARGV[1] the owner; ARGV[2] the
-- release channel; ARGV[3] "classic" to publish with PUBLISH only
-- (Options.ClassicPubSub); ARGV[4] the tombstone's life in milliseconds
-- (lease.EndedOwnerTTL).
-- Returns 1 when it ended a grant, 0 when the owner held none.
-- The tombstone is written first: whatever follows, the owner is ended.
redis.call('SET', KEYS[2], 'abandoned', 'PX', ARGV[4])
local _, owner = string.match(redis.call('GET', KEYS[1]) or '', '^(%d+):(.*)$')
if owner ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local sent = false
if ARGV[3] ~= 'classic' then
  sent = redis.pcall('SPUBLISH', ARGV[2], 'released')
end
if not sent or (type(sent) == 'table' and sent.err) then
  redis.pcall('PUBLISH', ARGV[2], 'released')
end
return 1
