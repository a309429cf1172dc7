-- release.lua: give an in-flight slot back, atomically.
--
-- KEYS[1]  the sorted set of leases (see acquire.lua)
-- ARGV[1]  lease id
-- Returns  1 if the lease was held, 0 if unknown, released already, or expired.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
return redis.call('ZREM', KEYS[1], ARGV[1])
