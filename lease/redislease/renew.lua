-- Extend a lease if ARGV[1] still owns it.
-- KEYS[1] the lease hash; ARGV[1] the owner; ARGV[2] the TTL in milliseconds.
-- Returns 1 when extended, 0 when the lease is gone or owned by another.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
