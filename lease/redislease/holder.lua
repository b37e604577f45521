-- Read the current grant of a lease.
-- KEYS[1] the lease. Returns {"<token>:<owner>", pttl}, or false when free.
local v = redis.call('GET', KEYS[1])
if not v then
  return false
end
return {v, redis.call('PTTL', KEYS[1])}
