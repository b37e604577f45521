-- Delete a lease if ARGV[1] with token ARGV[3] still holds it, and wake the
-- waiters.
-- KEYS[1] the lease hash; ARGV[1] the owner; ARGV[2] the release channel;
-- ARGV[3] the token of the grant.
-- Returns 1 when released, 0 when the lease is gone or another grant's.
local h = redis.call('HMGET', KEYS[1], 'owner', 'token')
if h[1] == ARGV[1] and h[2] == ARGV[3] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
