-- Extend a lease if ARGV[1] with token ARGV[3] still holds it.
-- KEYS[1] the lease hash; ARGV[1] the owner; ARGV[2] the TTL in
-- milliseconds; ARGV[3] the token of the grant.
-- Returns 1 when extended, 0 when the lease is gone or another grant's.
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
