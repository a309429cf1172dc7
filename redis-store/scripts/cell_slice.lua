-- cell_slice.lua: one replica of one cell reports a tenant's demand and spend, and gets its
-- cell's slice of the tenant's global limits, atomically, on the store's own clock. Every
-- replica of every cell runs it every sync interval: there is no elected reconciler, so the
-- loss of any one process stops nothing. The pure twin is `engine::cells::reconcile`.
--
-- KEYS[1]  the subject's reports: a hash (`weir:{tenant}:cells` for a tenant), one field per
--          cell and replica (`cell|replica`), valued `at demand_1 demand_2 spent_1 spent_2
--          answered_1 answered_2` (at: store microseconds; demands per second, or slots;
--          spends cumulative; the rate shares last answered, in force there)
-- ARGV[1]  this cell's name (no `|`)
-- ARGV[2]  this replica's name
-- ARGV[3]  fresh: a report counts as current for this many microseconds
-- ARGV[4]  hold: a cell with no current report keeps its last demand this long
--          (microseconds); older reports are deleted
-- ARGV[5]  live cells, as the registry last counted them (cell_heartbeat.lua)
-- ARGV[6]  floor: a fraction of the even share L / cells every cell is given at least
-- ARGV[7]  the request rate L (<= 0: not sliced)
-- ARGV[8]  the ingestion rate L (<= 0: not sliced)
-- ARGV[9]  this replica's offered requests per second since its last report
-- ARGV[10] this replica's offered items per second since its last report
-- ARGV[11] this replica's admitted requests, cumulative
-- ARGV[12] this replica's admitted items, cumulative
-- ARGV[13] the first limit's unit, ARGV[14] the second's (absent: 0): a live cell's floor is
--          at least one unit when the limit holds one per cell (an in-flight cap: 1 slot)
-- Returns  {request rate share, request burst share, ingestion rate share, ingestion burst
--          share (strings: floats in [0, 1]), cells counted}
--
-- A cell's demand is the sum of its replicas' current reports; a cell none of whose reports
-- is current (cut off from the store, or no longer offered the tenant) keeps the sum of its
-- held ones, since it may still be enforcing its last slice. Each of the cells counted (the
-- live ones, or more if more reported) claims max(demand, floor); L is water-filled over the
-- claims and what is left goes by claim, so the slices sum to L. A limit counted in units (an
-- in-flight cap) is a bound at every moment: the caller gets at most what the other cells
-- leave, each holding the largest share its replicas were last answered (an unreported live
-- cell, the floor).
local clock = redis.call('TIME')
local field_of_caller = ARGV[1] .. '|' .. ARGV[2]
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local me = ARGV[1]
local fresh_for = tonumber(ARGV[3])
local hold = tonumber(ARGV[4])
local live = tonumber(ARGV[5])
local floor_fraction = tonumber(ARGV[6])
local limits = {tonumber(ARGV[7]), tonumber(ARGV[8])}
local units = {tonumber(ARGV[13] or '0') or 0, tonumber(ARGV[14] or '0') or 0}

redis.call('HSET', KEYS[1], me .. '|' .. ARGV[2],
  string.format('%.0f', now) .. ' ' .. ARGV[9] .. ' ' .. ARGV[10] .. ' ' .. ARGV[11] .. ' ' .. ARGV[12])

-- Per cell: demand summed over current reports, over all held ones, and whether any is current.
local cells = {}
local names = {}
local entries = redis.call('HGETALL', KEYS[1])
for i = 1, #entries, 2 do
  local field, value = entries[i], entries[i + 1]
  local at, d1, d2 = string.match(value, '^(%S+) (%S+) (%S+)')
  at = tonumber(at)
  if at == nil or now - at > hold then
    redis.call('HDEL', KEYS[1], field)
  else
    local cell = string.sub(field, 1, string.find(field, '|', 1, true) - 1)
    local sums = cells[cell]
    if sums == nil then
      sums = {fresh = {0, 0}, held = {0, 0}, any = false, answered = {0, 0}}
      cells[cell] = sums
      names[#names + 1] = cell
    end
    if field ~= field_of_caller then
      local a1, a2 = string.match(value, '^%S+ %S+ %S+ %S+ %S+ (%S+) (%S+)')
      sums.answered[1] = math.max(sums.answered[1], tonumber(a1) or 0)
      sums.answered[2] = math.max(sums.answered[2], tonumber(a2) or 0)
    end
    local demand = {tonumber(d1), tonumber(d2)}
    local current = now - at <= fresh_for
    for kind = 1, 2 do
      sums.held[kind] = sums.held[kind] + demand[kind]
      if current then
        sums.fresh[kind] = sums.fresh[kind] + demand[kind]
      end
    end
    sums.any = sums.any or current
  end
end
table.sort(names)

local count = math.max(live, #names, 1)
local mine = 1
for i, name in ipairs(names) do
  if name == me then
    mine = i
  end
end

-- Water-filling of limit over claims, then the rest by claim (evenly if no claim).
local function allocate(limit, claims)
  local n = #claims
  local order = {}
  for i = 1, n do
    order[i] = i
  end
  table.sort(order, function(a, b)
    if claims[a] ~= claims[b] then
      return claims[a] < claims[b]
    end
    return a < b
  end)
  local slices = {}
  local remaining = limit
  local left = n
  for _, i in ipairs(order) do
    local slice = math.min(claims[i], remaining / left)
    slices[i] = slice
    remaining = remaining - slice
    left = left - 1
  end
  if remaining > 0 then
    local total = 0
    for i = 1, n do
      total = total + claims[i]
    end
    for i = 1, n do
      if total > 0 then
        slices[i] = slices[i] + remaining * claims[i] / total
      else
        slices[i] = slices[i] + remaining / n
      end
    end
  end
  return slices
end

local answer = {}
local answered = {}
for kind = 1, 2 do
  local limit = limits[kind]
  local rate, burst = 1, 1
  if limit > 0 then
    local even = limit / count
    local floor = floor_fraction * even
    if even >= units[kind] then
      floor = math.max(floor, units[kind])
    end
    local claims = {}
    for i, name in ipairs(names) do
      local sums = cells[name]
      local demand = sums.held[kind]
      if sums.any then
        demand = sums.fresh[kind]
      end
      claims[i] = math.max(demand, floor)
    end
    for i = #names + 1, count do
      claims[i] = floor
    end
    local slices = allocate(limit, claims)
    rate = math.max(0, math.min(1, slices[mine] / limit))
    burst = math.max(rate, 1 / count)
    if units[kind] > 0 then
      local in_force = (count - #names) * floor / limit
      for i, name in ipairs(names) do
        if name ~= me then
          in_force = in_force + cells[name].answered[kind]
        end
      end
      rate = math.min(rate, math.max(0, 1 - in_force))
      burst = math.min(burst, math.max(rate, 1 / count))
    end
  end
  answered[kind] = rate
  answer[#answer + 1] = string.format('%.17g', rate)
  answer[#answer + 1] = string.format('%.17g', burst)
end
answer[#answer + 1] = count

redis.call('HSET', KEYS[1], field_of_caller,
  string.format('%.0f', now) .. ' ' .. ARGV[9] .. ' ' .. ARGV[10] .. ' ' .. ARGV[11] .. ' ' ..
  ARGV[12] .. ' ' .. string.format('%.17g', answered[1]) .. ' ' ..
  string.format('%.17g', answered[2]))

redis.call('PEXPIRE', KEYS[1], math.ceil(hold / 1000) + 1000)
return answer
