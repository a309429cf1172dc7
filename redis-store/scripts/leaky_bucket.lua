-- leaky_bucket.lua: the leaky bucket as a meter with a bounded queue, in one atomic step on
-- the store's own clock. The twin of `engine::algorithms::LeakyBucket`.
--
-- KEYS[1]  a string: when everything admitted so far will have drained (µs): weir:{tenant}:k:<key>:l
-- ARGV[1]  rate: cost units per second (> 0)
-- ARGV[2]  capacity: the most backlog, in cost units
-- ARGV[3]  cost
-- Returns  {allowed (1/0), remaining, retry_after µs, reset_after µs, delay µs}: an admitted
--          request should proceed after `delay`, when the backlog ahead of it has drained.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local period = 1000000 / tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local clears_at = tonumber(redis.call('GET', KEYS[1])) or now
local start = math.max(clears_at, now)
local finish = start + cost * period
local backlog = finish - now
local bound = capacity * period
if backlog > bound + 0.5 then
  local queued = math.max(0, clears_at - now)
  return {0, math.max(0, math.floor((bound - queued) / period)), math.ceil(backlog - bound), math.ceil(queued), 0}
end
redis.call('SET', KEYS[1], string.format('%.0f', finish), 'PX', math.ceil(backlog / 1000) + 1000)
return {1, math.max(0, math.floor((bound - backlog) / period)), 0, math.ceil(backlog), math.ceil(start - now)}
