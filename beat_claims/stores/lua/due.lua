-- What falls due: in each bucket's due index, the entries whose next due instant is at or
-- before ARGV[1], in (instant, name) order (names byte by byte, as the zsets order them),
-- the first ARGV[2] after (ARGV[3], ARGV[4]) (exclusive; ARGV[3] '' : from the start),
-- read by rank (O(log N) to find the start, whatever the ties before it). The caller
-- merges the buckets.
-- With ARGV[5] '1', also each bucket's first instant after ARGV[1] (when to read again).
-- KEYS: the buckets' due indexes (one bucket per call on a cluster, where each has its
-- own slot; all of them on one server). Returns, as one JSON string, [names of each key,
-- instants of each key (as text), keys of the wrong kind, the first instants after
-- ARGV[1] (as text; of the keys that have one)].
local limit = tonumber(ARGV[2])
local after_due, after_name = tonumber(ARGV[3]), ARGV[4]

-- a < b as the zsets order members: byte by byte (Lua's own < follows the locale).
local function bytes_less(a, b)
  if a == b then return false end
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- The rank of the first member of ``key`` after (after_due, after_name).
local function start_of(key)
  if not after_due then return 0 end
  local lo = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[3])
  local hi = redis.call('ZCOUNT', key, '-inf', ARGV[3])
  while lo < hi do  -- members lo .. hi - 1 all have the instant after_due, by name
    local mid = math.floor((lo + hi) / 2)
    if bytes_less(after_name, redis.call('ZRANGE', key, mid, mid)[1]) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

local names, instants, bad, later = {}, {}, {}, {}
for _, key in ipairs(KEYS) do
  if key_is(key, 'zset') then
    local start = start_of(key)
    local due = redis.call('ZCOUNT', key, '-inf', ARGV[1])
    local stop = math.min(due, start + limit)
    if ARGV[5] == '1' then
      local next = redis.call('ZRANGE', key, due, due, 'WITHSCORES')
      if next[2] then later[#later + 1] = next[2] end
    end
    local mine, dues = {}, {}
    if start < stop then
      local rows = redis.call('ZRANGE', key, start, stop - 1, 'WITHSCORES')
      for i = 1, #rows, 2 do
        mine[#mine + 1] = rows[i]
        dues[#dues + 1] = rows[i + 1]
      end
    end
    names[#names + 1] = mine
    instants[#instants + 1] = dues
  else
    bad[#bad + 1] = key
    names[#names + 1] = {}
    instants[#instants + 1] = {}
  end
end
return cjson.encode({names, instants, bad, later})
