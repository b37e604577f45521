-- Delete a lease if it is still the grant ARGV[1] ("<token>:<owner>"), wake
-- the waiters, and remember the owner as ended.
-- KEYS[1] the lease; KEYS[2] the owner's tombstone
-- ("<prefix>{<name>}:ended:<owner>"). ARGV[1] the grant; ARGV[2] the release
-- channel; ARGV[3] the tombstone's life in milliseconds
-- (lease.EndedOwnerTTL). notice, a local the backend defines on a line of
-- its own before this script, is the command that publishes the notice:
-- 'SPUBLISH' or 'PUBLISH' (Options.ClassicPubSub).
-- Returns 1 when released; 2 when the lease is not the grant but the owner
-- was already ended by a release that released it (this release, resent by
-- the client after its reply was lost) or by an abandon: a release, not a
-- loss; 0 when the lease is gone or another grant's, and the owner was not
-- ended before, or ended by a release that found it lost already (a resent
-- release answers what the first one did).
-- Whatever the outcome, the tombstone lives ARGV[3] ms from now, so that a
-- late acquire request of the owner is refused (acquire.lua). It holds how
-- the owner ended: "released", "lost" or "abandoned" (abandon.lua).
-- The notice goes out with SPUBLISH (sharded pub/sub, Redis 7.0+: on a
-- Cluster it reaches only the nodes of the lease's shard), or with PUBLISH
-- on a server without it; through pcall, so that a refused notice cannot
-- fail a release whose DEL is already done (pcall answers an error as a
-- table, a delivery as a number).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], 'released', 'PX', ARGV[3])
  if type(redis.pcall(notice, ARGV[2], 'released')) == 'table' and notice ~= 'PUBLISH' then
    redis.pcall('PUBLISH', ARGV[2], 'released')
  end
  return 1
end
local ended = redis.call('GET', KEYS[2])
if not ended then
  redis.call('SET', KEYS[2], 'lost', 'PX', ARGV[3])
  return 0
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if ended == 'lost' then
  return 0
end
return 2
