-- renew.lua: move a held lease's deadline, atomically.
--
-- KEYS[1]  the sorted set of leases (see acquire.lua)
-- ARGV[1]  lease id
-- ARGV[2]  ttl, milliseconds, from now
-- Returns  1 if renewed; 0 if unknown, released or already expired (an expired lease is
--          gone: its slot may have been taken).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local deadline = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if deadline == nil or deadline <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
local next = now + tonumber(ARGV[2]) * 1000
redis.call('ZADD', KEYS[1], 'XX', string.format('%.0f', next), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2]) / 1000) + 1000)
return 1
