-- Read the current grant of a lease and count its live waiters in line.
-- KEYS[1] the lease; KEYS[2] the places of its line (owners scored by when
-- each place lapses, server time in milliseconds: see acquire.lua).
-- Returns {"<token>:<owner>" or "", pttl, live waiters}. Writes nothing.
local now = redis.call('TIME')
local nowms = now[1] * 1000 + math.floor(now[2] / 1000)
local waiters = redis.call('ZCOUNT', KEYS[2], '(' .. nowms, '+inf')
local v = redis.call('GET', KEYS[1])
if not v then
  return {'', -2, waiters}
end
return {v, redis.call('PTTL', KEYS[1]), waiters}
