-- Revoke a grant: delete the lease if it is still the grant ARGV[1]
-- ("<token>:<owner>"), wake the waiters, and remember the owner as ended
-- by a loss, so that its late acquire requests are refused (acquire.lua)
-- and its Release answers that it was lost (release.lua).
-- KEYS[1] the lease; KEYS[2] the owner's tombstone
-- ("<prefix>{<name>}:ended:<owner>"). ARGV[1] the grant; ARGV[2] the
-- release channel; ARGV[3] "classic" to publish with PUBLISH only
-- (Options.ClassicPubSub); ARGV[4] the tombstone's life in milliseconds
-- (driver.RevokedOwnerTTL).
-- Returns 1 when revoked, 0 (having changed nothing) when the lease is
-- free or another grant's. The token counter is left alone: the next
-- grant's token is greater.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], 'lost', 'PX', ARGV[4])
local sent = false
if ARGV[3] ~= 'classic' then
  sent = redis.pcall('SPUBLISH', ARGV[2], 'released')
end
if not sent or (type(sent) == 'table' and sent.err) then
  redis.pcall('PUBLISH', ARGV[2], 'released')
end
return 1
