-- Delete a lease if ARGV[1] still owns it, and wake the waiters.
-- KEYS[1] the lease hash; ARGV[1] the owner; ARGV[2] the release channel.
-- Returns 1 when released, 0 when the lease is gone or owned by another.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
