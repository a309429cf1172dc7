-- sliding_window.lua: the sliding-window counter, checked and counted in one atomic step on
-- the store's own clock. The twin of `engine::algorithms::SlidingWindow`.
--
-- KEYS[1]  a hash {start, previous, current}: weir:{tenant}:k:<key>:w
-- ARGV[1]  limit: what one window allows
-- ARGV[2]  window, microseconds (> 0)
-- ARGV[3]  cost
-- Returns  {allowed (1/0), remaining, retry_after µs, reset_after µs}
--
-- The estimate is the previous fixed window's count, weighted by the part of it the last
-- `window` still overlaps, plus the current window's. Elapsed time is clamped at >= 0.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local state = redis.call('HMGET', KEYS[1], 'start', 'previous', 'current')
local start = tonumber(state[1]) or now
local previous = tonumber(state[2]) or 0
local current = tonumber(state[3]) or 0
if now < start then
  now = start
end
if now >= start + window then
  local windows = math.floor((now - start) / window)
  if windows == 1 then
    previous = current
  else
    previous = 0
  end
  current = 0
  start = start + windows * window
end
local estimate = previous * (1 - (now - start) / window) + current
local reset_after = start + window - now
local allowed = 0
local remaining = 0
local retry_after = 0
if estimate + cost <= limit then
  allowed = 1
  current = current + cost
  remaining = math.floor(limit - estimate - cost)
else
  remaining = math.max(0, math.floor(limit - estimate))
  local room = limit - current - cost
  if room >= 0 and previous > 0 then
    retry_after = math.max(0, start + window * (1 - room / previous) - now)
  elseif current > 0 then
    retry_after = math.max(0, start + window + window * math.max(0, 1 - (limit - cost) / current) - now)
  else
    retry_after = reset_after
  end
end
redis.call('HSET', KEYS[1], 'start', string.format('%.0f', start), 'previous', string.format('%.17g', previous),
  'current', string.format('%.17g', current))
redis.call('PEXPIRE', KEYS[1], math.ceil(2 * window / 1000) + 1000)
return {allowed, remaining, math.ceil(retry_after), math.ceil(reset_after)}
