-- Runs sent or started whose last activity is in (after, before), oldest first, from
-- buckets' open zsets (one bucket per call on a cluster; all of them on one server).
-- KEYS: the open zsets. ARGV: after ('-inf' or '(ms'), before ('(ms'), limit.
-- Returns per key its members and scores (flat).
local out = {}
for _, key in ipairs(KEYS) do
  if key_is(key, 'zset') then
    out[#out + 1] = redis.call('ZRANGEBYSCORE', key, ARGV[1], ARGV[2], 'WITHSCORES',
                               'LIMIT', 0, tonumber(ARGV[3]))
  else
    out[#out + 1] = {}  -- an unreadable bucket: skipped (live.lua names it)
  end
end
return out
