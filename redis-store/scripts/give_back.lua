-- give_back.lua: put unspent leased tokens back into a token bucket, atomically, on the
-- store's own clock. The pure twin is `engine::store::give_back`.
--
-- KEYS[1]  the bucket (see take.lua)
-- ARGV[1]  rate: tokens per second, > 0
-- ARGV[2]  burst: the bucket's capacity, >= 1
-- ARGV[3]  tokens to put back
-- Returns  the tokens in the bucket afterwards (a string: a float)
--
-- The bucket is refilled to now first, and capped at the burst after the return: giving
-- back can never make a bucket fuller than full, so a late or repeated return cannot
-- admit more than the limit.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local back = tonumber(ARGV[3])

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
  tokens = tokens + elapsed * rate / 1000000
end
tokens = math.min(burst, tokens + back)

redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return string.format('%.17g', tokens)
