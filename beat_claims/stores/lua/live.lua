-- A sweep's look at buckets: the runs due again, and the held claims that may need
-- taking back: claimed or checked before the cutoff whoever holds them, held by an owner
-- not known alive, or held by the caller since before its own cutoff.
-- KEYS: each bucket's due and held zsets, bucket after bucket (one bucket per call on a
-- cluster, where each has its own slot; all of them on one server). ARGV: owner, held
-- before, mine before, dead before, limit, then the ids of the live owners.
-- Returns, as one JSON string (one value for the client to read), [due members, held
-- members and scores (flat), more (1 if cut short), keys of the wrong kind], over every
-- bucket of the call.
local me = ARGV[1]
local held_before, mine_before, dead_before = tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4])
local limit = tonumber(ARGV[5])
local live = {}
for i = 6, #ARGV do live[ARGV[i]] = true end
local top = math.max(held_before, mine_before, dead_before)
local all_due, all_held, bad = {}, {}, {}
local more = 0
for k = 1, #KEYS, 2 do
  local due_ok, held_ok = key_is(KEYS[k], 'zset'), key_is(KEYS[k + 1], 'zset')
  if not (due_ok and held_ok) then
    -- an unreadable bucket: the key of the wrong kind is named, the bucket skipped
    if not due_ok then bad[#bad + 1] = KEYS[k] end
    if not held_ok then bad[#bad + 1] = KEYS[k + 1] end
  else
  local due = redis.call('ZRANGE', KEYS[k], 0, limit)
  if #due > limit then
    due[#due] = nil
    more = 1
  end
  for _, member in ipairs(due) do all_due[#all_due + 1] = member end
  local held = {}
  local rows = redis.call('ZRANGEBYSCORE', KEYS[k + 1], '-inf', '(' .. fmt(top), 'WITHSCORES')
  for i = 1, #rows, 2 do
    local member, score = rows[i], tonumber(rows[i + 1])
    local owner = string.match(member, '^([^|]*)|') or ''
    if score < held_before or (owner == me and score < mine_before)
        or (owner ~= me and not live[owner] and score < dead_before) then
      if #held >= 2 * limit then
        more = 1
        break
      end
      held[#held + 1] = member
      held[#held + 1] = rows[i + 1]
    end
  end
  for _, value in ipairs(held) do all_held[#all_held + 1] = value end
  end
end
return cjson.encode({all_due, all_held, more, bad})
