-- Grant a lease and mint its fencing token, atomically.
-- KEYS[1] the lease: a string "<token>:<owner>" with a TTL; KEYS[2] the
-- token counter (the last token granted for the name; no TTL); KEYS[3] the
-- owner's tombstone ("<prefix>{<name>}:ended:<owner>"), which release.lua
-- and abandon.lua write when they end the owner.
-- ARGV[1] the owner; ARGV[2] the TTL in milliseconds.
-- Returns the token (> 0) when granted, or already held by ARGV[1] (then
-- extended, same token); -pttl - 1 (< 0) when another owner holds it; 0 when
-- ARGV[1] was ended (released or abandoned) within its tombstone's life: a
-- request that reached Redis after its sender stopped waiting for it must
-- not grant the name to an owner nobody holds; an error when the lease key
-- has no TTL (fencekit never writes one: it would hold the lease forever).
--
-- The token is the larger of the last token + 1 and the server clock in
-- microseconds, so that it keeps growing when the counter is lost (FLUSHALL,
-- a restart without persistence, eviction, a failover to a lagging replica).
-- The token is computed on every attempt and stored in the counter only
-- with a grant.
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
local now = redis.call('TIME')
local token = now[1] * 1000000 + now[2]
local counter = redis.call('GET', KEYS[2])
if counter then
  local last = tonumber(counter)
  if not last or last ~= math.floor(last) or last < 0 then
    -- Fail closed, before any write: a counter that is not a whole number
    -- (say "nan") would mint a token that is not a number.
    return redis.error_reply('fencekit: token counter ' .. KEYS[2] .. ' holds ' .. string.sub(counter, 1, 40) .. ', not a whole number')
  end
  if last >= token then
    token = last + 1
  end
end
if token >= 9007199254740992 then
  return redis.error_reply('fencekit: token counter ' .. KEYS[2] .. ' is beyond 2^53')
end
local s = string.format('%d', token)
-- The common case in one command: the lease is free.
if redis.call('SET', KEYS[1], s .. ':' .. ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('SET', KEYS[2], s)
  return token
end
local held, owner = string.match(redis.call('GET', KEYS[1]) or '', '^(%d+):(.*)$')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(held)
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  return redis.error_reply('fencekit: lease key ' .. KEYS[1] .. ' has no TTL: it was not written by fencekit, and would hold the lease forever')
end
return -pttl - 1
