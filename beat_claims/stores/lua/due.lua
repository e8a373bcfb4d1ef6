-- What falls due: the entries of buckets' due indexes whose next due instant is at or
-- before ARGV[1], in (instant, name) order (names compared byte by byte, as the zsets
-- order them), the first ARGV[2] after (ARGV[3], ARGV[4]) (exclusive; ARGV[3] '' : from
-- the start). Each bucket is read by rank, a chunk at a time, and the buckets merged.
-- KEYS: the buckets' due indexes (one bucket per call on a cluster, where each has its
-- own slot; all of them on one server). Returns, as one JSON string, [names, instants,
-- keys of the wrong kind].
local before, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
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

local chunk = math.max(16, math.ceil(2 * limit / #KEYS))
local cursors, bad = {}, {}
for _, key in ipairs(KEYS) do
  if key_is(key, 'zset') then
    local start = start_of(key)
    local stop = redis.call('ZCOUNT', key, '-inf', ARGV[1])  -- ranks below it are due
    if start < stop then
      cursors[#cursors + 1] = {key = key, next = start, stop = stop, rows = {}, i = 1}
    end
  else
    bad[#bad + 1] = key
  end
end

-- The cursor's current member (name, instant), fetching its next chunk when needed; nil
-- when it is done.
local function head(c)
  if c.i > #c.rows then
    if c.next >= c.stop then return nil end
    local last = math.min(c.stop, c.next + chunk) - 1
    c.rows, c.i = redis.call('ZRANGE', c.key, c.next, last, 'WITHSCORES'), 1
    c.next = last + 1
    if #c.rows == 0 then return nil end
  end
  return c.rows[c.i], tonumber(c.rows[c.i + 1])
end

local names, instants = {}, {}
while #names < limit do
  local best, best_name, best_due
  for _, c in ipairs(cursors) do
    local name, due = head(c)
    if name and (best == nil or due < best_due
                 or (due == best_due and bytes_less(name, best_name))) then
      best, best_name, best_due = c, name, due
    end
  end
  if best == nil or best_due > before then break end
  names[#names + 1] = best_name
  instants[#instants + 1] = fmt(best_due)
  best.i = best.i + 2
end
return cjson.encode({names, instants, bad})
