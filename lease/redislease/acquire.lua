-- Grant a lease and mint its fencing token, atomically.
-- KEYS[1] the lease: a string "<token>:<owner>" with a TTL; KEYS[2] the
-- token counter (the last token granted for the name; no TTL); KEYS[3] the
-- owner's tombstone ("<prefix>{<name>}:ended:<owner>"), which release.lua
-- and abandon.lua write when they end the owner.
-- ARGV[1] the owner; ARGV[2] the TTL in milliseconds.
-- With KEYS[4] and KEYS[5] (driver.Request.Queue), the owner waits in line:
-- KEYS[4] the line, a sorted set of owners scored by arrival (1, 2, ...);
-- KEYS[5] the places, the same owners scored by the server time in
-- milliseconds when each place lapses unless the owner asks again. A free
-- name is granted only to the first live waiter (or when the line is
-- empty); a refused owner joins the end of the line, or keeps its place,
-- for ARGV[2] ms from now; a grant takes it out of the line.
-- Returns the token (> 0) when granted, or already held by ARGV[1] (then
-- extended, same token); -pttl - 1 (< 0) when another owner holds it; 0 when
-- ARGV[1] was ended (released or abandoned) within its tombstone's life: a
-- request that reached Redis after its sender stopped waiting for it must
-- not grant the name to an owner nobody holds; an error when the lease key
-- has no TTL (fencekit never writes one: it would hold the lease forever).
--
-- The reply when the name is free but kept for earlier waiters is
-- {ahead, ms}: how many live waiters are ahead, and the time left of the
-- first one's place.
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
local queue = KEYS[5] ~= nil
-- Only a queued acquire pays for the line: an unqueued one (TryAcquire, a
-- Manager without FIFO) neither computes the time in milliseconds nor
-- makes the closure below.
local nowms, join
if queue then
  nowms = now[1] * 1000 + math.floor(now[2] / 1000)
  join = function()
    if not redis.call('ZSCORE', KEYS[4], ARGV[1]) then
      local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
      local seq = 1
      if #last == 2 then
        seq = tonumber(last[2]) + 1
      end
      redis.call('ZADD', KEYS[4], seq, ARGV[1])
    end
    redis.call('ZADD', KEYS[5], nowms + tonumber(ARGV[2]), ARGV[1])
    -- The line outlives its longest place, and no more.
    for k = 4, 5 do
      if redis.call('PTTL', KEYS[k]) < tonumber(ARGV[2]) then
        redis.call('PEXPIRE', KEYS[k], ARGV[2])
      end
    end
  end
  -- Places that lapsed (their waiters stopped asking) leave the line.
  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', nowms)
  for _, o in ipairs(lapsed) do
    redis.call('ZREM', KEYS[4], o)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', nowms)
  if redis.call('EXISTS', KEYS[1]) == 0 then
    local rank = redis.call('ZRANK', KEYS[4], ARGV[1])
    if not rank then
      rank = redis.call('ZCARD', KEYS[4])
    end
    if rank > 0 then
      join()
      local first = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
      return {rank, tonumber(redis.call('ZSCORE', KEYS[5], first)) - nowms}
    end
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('ZREM', KEYS[5], ARGV[1])
  end
end
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
if queue then
  join()
end
return -pttl - 1
