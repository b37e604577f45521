-- Delete a lease if it is still the grant ARGV[1] ("<token>:<owner>"), and
-- wake the waiters.
-- KEYS[1] the lease; ARGV[1] the grant; ARGV[2] the release channel;
-- ARGV[3] "classic" to publish with PUBLISH only (Options.ClassicPubSub).
-- Returns 1 when released, 0 when the lease is gone or another grant's.
-- The notice goes out with SPUBLISH (sharded pub/sub, Redis 7.0+: on a
-- Cluster it reaches only the nodes of the lease's shard), or with PUBLISH
-- on a server without it; through pcall, so that a refused notice cannot
-- fail a release whose DEL is already done.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local sent = false
  if ARGV[3] ~= 'classic' then
    sent = redis.pcall('SPUBLISH', ARGV[2], 'released')
  end
  if not sent or (type(sent) == 'table' and sent.err) then
    redis.pcall('PUBLISH', ARGV[2], 'released')
  end
  return 1
end
return 0
