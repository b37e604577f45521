-- fencekit redischeck: accept a fencing token if it is not older than the
-- newest accepted for the resource, and remember it, in one atomic step.
--
-- KEYS[1]  the resource's key
-- ARGV[1]  the presented token: 1 to 20 decimal digits, no leading zero
--
-- Returns {1, token} when accepted (the key now holds it), {0, current}
-- when the stored token is newer (nothing changed). Tokens are compared as
-- decimal strings, never as Lua numbers: those are doubles and lose
-- precision above 2^53, and a fencing token is a uint64.
local presented = ARGV[1]
local current = redis.call('GET', KEYS[1])
if current then
  if #current > 20 or not string.match(current, '^[1-9][0-9]*$') then
    return redis.error_reply('FENCEKIT_CORRUPT the key of a fencing token holds ' .. string.format('%q', string.sub(current, 1, 40)) .. ', not a token')
  end
  if #presented < #current or (#presented == #current and presented < current) then
    return {0, current}
  end
end
redis.call('SET', KEYS[1], presented)
return {1, presented}
