-- take.lua: refill, check and take from one token bucket, in one atomic step, on the store's
-- own clock. The pure twin of this script is `engine::store::take`; the Redis store's tests
-- check the two against each other.
--
-- KEYS[1]  the bucket, a hash {tokens, ts}: weir:{tenant}:i (ingestion) or weir:{tenant}:r
--          (requests); with store_shards, weir:{tenant#k}:… for sub-bucket k.
-- ARGV[1]  rate: tokens per second, > 0
-- ARGV[2]  burst: the bucket's capacity, >= 1
-- ARGV[3]  want: take up to this many
-- ARGV[4]  min: take nothing unless at least this many are there
-- Returns  {granted, remaining tokens (a string: a float), wait in microseconds until `min`
--          tokens are there (0 when granted)}
--
-- Time is the store's (TIME), never a caller's, so replicas with skewed clocks agree. Elapsed
-- time is clamped at >= 0 (a clock that steps back, as after a failover, refills nothing);
-- tokens are capped at the burst; a missing key is a full bucket. The key expires once the
-- bucket would be full again, so an idle tenant costs the store nothing.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local min = tonumber(ARGV[4])

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts = tonumber(state[2])
if tokens == nil or ts == nil then
  tokens = burst
else
  local elapsed = now - ts
  if elapsed < 0 then
    elapsed = 0
  end
  tokens = math.min(burst, tokens + elapsed * rate / 1000000)
end

local granted = 0
local wait = 0
if tokens >= min then
  granted = math.min(want, math.floor(tokens))
  tokens = tokens - granted
else
  wait = math.ceil((min - tokens) / rate * 1000000)
end

redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return {granted, string.format('%.17g', tokens), wait}
