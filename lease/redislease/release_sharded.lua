-- Delete a lease if ARGV[1] still owns it, and wake the waiters.
-- KEYS[1] the lease hash; ARGV[1] the owner; ARGV[2] the release channel.
-- Returns 1 when released, 0 when the lease is gone or owned by another.
-- The notice goes out with SPUBLISH (sharded pub/sub, Redis 7.0+: on a
-- Cluster it reaches only the nodes of the lease's shard), or with PUBLISH on
-- a server without it; pcall, so that a refused notice cannot fail a
-- release whose DEL is already done.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local sent = redis.pcall('SPUBLISH', ARGV[2], 'released')
  if type(sent) == 'table' and sent.err then
    redis.pcall('PUBLISH', ARGV[2], 'released')
  end
  return 1
end
return 0
