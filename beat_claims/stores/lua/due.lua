-- What falls due: in each bucket's due index, the entries whose instant is before ARGV[1]
-- (the instant after the last one asked for), in (instant, name) order (names byte by
-- byte, as the zsets order them), the first ARGV[2] after (ARGV[3], ARGV[4]) (exclusive;
-- ARGV[3] '' : from the start; ARGV[6]: ARGV[3] + 1), read by rank (O(log N) to find the
-- start, whatever the ties before it). The caller merges the buckets, in the same order,
-- and pages from the last entry it was answered.
-- A member's instant is its score's whole part: the index holds whole ms, but a score
-- written by something else (1000.7 beside 1000.2, their names the other way round) is
-- ordered as the reader's cursor is, by its instant and name: an instant that has such a
-- score is read whole and ordered by name. A score that is no instant (not finite, beyond
-- 2^53 ms) is left out; with ARGV[7] '1' (the caller met one before), so is a member whose
-- bytes are not UTF-8 (it names no entry; read with replacement characters it would sort
-- elsewhere than its bytes).
-- With ARGV[5] '1', also each bucket's first score at or after ARGV[1] (when to read
-- again).
-- KEYS: the buckets' due indexes (one bucket per call on a cluster, where each has its
-- own slot; all of them on one server). Returns, as one JSON string, [names of each key,
-- instants of each key (whole ms, as text), keys of the wrong kind, the first scores at or
-- after ARGV[1] (as text; of the keys that have one)].
local until_text, limit = ARGV[1], tonumber(ARGV[2])
local after_due, after_name = tonumber(ARGV[3]), ARGV[4]
local careful = ARGV[7] == '1'
local find, byte, concat, floor, format = string.find, string.byte, table.concat, math.floor,
  string.format
local WHOLE = 9007199254740991  -- 2^53 - 1: the instants a reader takes (whole ms)

-- a < b as the zsets order members: byte by byte (Lua's own < follows the locale).
local function bytes_less(a, b)
  if a == b then return false end
  for i = 1, math.min(#a, #b) do
    local x, y = byte(a, i), byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Whether ``s`` is UTF-8 as the reader decodes it (strictly: no overlong form, no
-- surrogate, nothing past U+10FFFF).
local function utf8(s)
  if not find(s, '[\128-\255]') then return true end
  local i, n = 1, #s
  while i <= n do
    local c = byte(s, i)
    if c < 0x80 then
      i = i + 1
    else
      local size, low, high
      if c >= 0xC2 and c <= 0xDF then size, low, high = 2, 0x80, 0xBF
      elseif c == 0xE0 then size, low, high = 3, 0xA0, 0xBF
      elseif c == 0xED then size, low, high = 3, 0x80, 0x9F
      elseif c >= 0xE1 and c <= 0xEF then size, low, high = 3, 0x80, 0xBF
      elseif c == 0xF0 then size, low, high = 4, 0x90, 0xBF
      elseif c >= 0xF1 and c <= 0xF3 then size, low, high = 4, 0x80, 0xBF
      elseif c == 0xF4 then size, low, high = 4, 0x80, 0x8F
      else return false end
      if i + size - 1 > n then return false end
      local second = byte(s, i + 1)
      if second < low or second > high then return false end
      for j = i + 2, i + size - 1 do
        local more = byte(s, j)
        if more < 0x80 or more > 0xBF then return false end
      end
      i = i + size
    end
  end
  return true
end

-- A score's instant (its whole part) as text, and whether the score is that whole
-- number; nil when it is no instant.
local function instant(score)
  if #score < 16 and not find(score, '[^%d]') then return score, true end  -- (as a rule)
  local x = tonumber(score)
  if not x or x ~= x or x < -WHOLE or x > WHOLE then return nil end
  local whole = floor(x)
  return format('%.0f', whole), whole == x
end

-- The members of ``key`` whose instant is ``at`` (scores from ``at`` to ``next``,
-- exclusive) after the name ``after`` (nil: all), in name order; careful, only those that
-- are UTF-8 (else all: one that is not makes the caller read again careful, whereas left
-- out here it could leave a page that ends at this instant short of ``limit``).
local function at_instant(key, at, next, after)
  local kept = {}
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', key, at, '(' .. next)) do
    if (not after or bytes_less(after, member)) and (not careful or utf8(member)) then
      kept[#kept + 1] = member
    end
  end
  table.sort(kept, bytes_less)
  return kept
end

-- The first ``limit`` entries of ``key`` after the cursor: their names and instants.
local function read(key, due)
  local mine, dues = {}, {}
  local rank = 0
  local read_whole  -- the last instant read whole
  if after_due then
    local lo = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[3])
    local hi = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[6])
    if redis.call('ZCOUNT', key, ARGV[3], ARGV[3]) == hi - lo then
      -- (as a rule: the instant's members all have it as their score, ranked by name)
      while lo < hi do
        local mid = floor((lo + hi) / 2)
        if bytes_less(after_name, redis.call('ZRANGE', key, mid, mid)[1]) then
          hi = mid
        else
          lo = mid + 1
        end
      end
      rank = lo
    else
      if after_due + 1 <= tonumber(until_text) then
        for _, member in ipairs(at_instant(key, ARGV[3], ARGV[6], after_name)) do
          mine[#mine + 1] = member
          dues[#dues + 1] = ARGV[3]
        end
      end
      rank, read_whole = hi, ARGV[3]
    end
  end
  while #mine < limit and rank < due do
    local stop = math.min(due, rank + limit - #mine)
    local rows = redis.call('ZRANGE', key, rank, stop - 1, 'WITHSCORES')
    local names, scores, n = {}, {}, 0
    for i = 1, #rows, 2 do
      n = n + 1
      names[n], scores[n] = rows[i], rows[i + 1]
    end
    rank = stop
    if not find(concat(scores, ','), '[^%d,]')
        and not (careful and find(concat(names), '[\128-\255]')) then
      if #mine == 0 then  -- (as a rule: whole ms, the page's first read)
        mine, dues = names, scores
      else
        for i = 1, #names do
          mine[#mine + 1] = names[i]
          dues[#dues + 1] = scores[i]
        end
      end
    else
      for i = 1, #names do
        local at, whole = instant(scores[i])
        if at and not whole then
          -- Read the whole instant, in name order (its members read so far come first).
          while dues[#dues] == at do
            mine[#mine] = nil
            dues[#dues] = nil
          end
          local next = format('%.0f', tonumber(at) + 1)
          for _, member in ipairs(at_instant(key, at, next)) do
            mine[#mine + 1] = member
            dues[#dues + 1] = at
          end
          rank = redis.call('ZCOUNT', key, '-inf', '(' .. next)
          read_whole = at
          break
        elseif at and (not careful or utf8(names[i])) then
          mine[#mine + 1] = names[i]
          dues[#dues + 1] = at
        end
      end
    end
  end
  local last = dues[#dues]
  if rank < due and last and last ~= read_whole then
    -- The page ends inside an instant whose members with whole scores come first: one
    -- with a score that is not (ranked after them) may come before them by name.
    local next = format('%.0f', tonumber(last) + 1)
    if redis.call('ZCOUNT', key, last, last) ~= redis.call('ZCOUNT', key, last, '(' .. next)
    then
      while dues[#dues] == last do
        mine[#mine] = nil
        dues[#dues] = nil
      end
      for _, member in ipairs(at_instant(key, last, next,
                                         last == ARGV[3] and after_name or nil)) do
        mine[#mine + 1] = member
        dues[#dues + 1] = last
      end
    end
  end
  for i = #mine, limit + 1, -1 do  -- (an instant read whole may go past the page)
    mine[i] = nil
    dues[i] = nil
  end
  return mine, dues
end

local names, instants, bad, later = {}, {}, {}, {}
for _, key in ipairs(KEYS) do
  if key_is(key, 'zset') then
    local due = redis.call('ZCOUNT', key, '-inf', '(' .. until_text)
    if ARGV[5] == '1' then
      local next = redis.call('ZRANGE', key, due, due, 'WITHSCORES')
      if next[2] then later[#later + 1] = next[2] end
    end
    local mine, dues = read(key, due)
    names[#names + 1] = mine
    instants[#instants + 1] = dues
  else
    bad[#bad + 1] = key
    names[#names + 1] = {}
    instants[#instants + 1] = {}
  end
end
return cjson.encode({names, instants, bad, later})
