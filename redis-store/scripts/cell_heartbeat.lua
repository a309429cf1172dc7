-- cell_heartbeat.lua: a replica says its cell is alive, and learns how many cells are, on
-- the store's own clock. Every replica runs it once per sync interval, before its tenants'
-- cell_slice.lua calls, which take the count as an argument (the registry is another key,
-- and a Redis Cluster script touches one slot).
--
-- KEYS[1]  the registry: a sorted set `weir:cells`, cell name scored by when last heard
--          (store microseconds)
-- ARGV[1]  this cell's name
-- ARGV[2]  hold: cells not heard from for this many microseconds are dropped
-- Returns  the number of live cells, this one included
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local hold = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], string.format('%.0f', now), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.0f', now - hold))
redis.call('PEXPIRE', KEYS[1], math.ceil(hold / 1000) + 1000)
return redis.call('ZCARD', KEYS[1])
