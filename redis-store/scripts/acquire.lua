-- acquire.lua: take one in-flight slot, atomically: drop expired leases, count, add.
--
-- KEYS[1]  a sorted set of leases scored by deadline (µs): weir:{tenant}:k:<key>:c
-- ARGV[1]  lease id
-- ARGV[2]  max: slots in flight at once
-- ARGV[3]  ttl, milliseconds: the lease's deadline; a holder that crashes frees its slot then
-- Returns  {granted (1/0), in flight (after), retry_after µs (until the earliest deadline)}
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local max = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3]) * 1000

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
local in_flight = redis.call('ZCARD', KEYS[1])
if in_flight < max then
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) / 1000) + 1000)
  return {1, in_flight + 1, 0}
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {0, in_flight, math.ceil(tonumber(first[2]) - now)}
