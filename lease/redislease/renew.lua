-- Extend a lease if it is still the grant ARGV[1] ("<token>:<owner>").
-- KEYS[1] the lease; ARGV[1] the grant; ARGV[2] the TTL in milliseconds.
-- Returns 1 when extended, 0 when the lease is gone or another grant's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
