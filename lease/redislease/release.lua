-- Delete a lease if it is still the grant ARGV[1] ("<token>:<owner>"), and
-- wake the waiters.
-- KEYS[1] the lease; ARGV[1] the grant; ARGV[2] the release channel.
-- Returns 1 when released, 0 when the lease is gone or another grant's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
