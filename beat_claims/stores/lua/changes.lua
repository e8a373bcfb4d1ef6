-- The change feed's look at buckets (Store.changes), each bucket's log read at once: its
-- head (the last sequence number handed out), its dropped mark (the newest number of a
-- member that left it), its newest member, the number it holds for the caller's last
-- entry read (a store that went back holds an older one, or none), and its members after
-- the caller's position, oldest first, at most limit + 1.
-- KEYS: each bucket's change log and sequence hash, bucket after bucket (one bucket per
-- call on a cluster, where each has its own slot; all of them on one server). ARGV: limit,
-- then for each bucket the caller's position and last entry read ('' none).
-- Returns, as one JSON string, for each bucket: [head, dropped, newest member, its number,
-- the number held for the caller's entry ('' none), members and numbers (flat), a key of
-- the wrong kind ('' none: then the bucket was not read)].
local limit = tonumber(ARGV[1])
local out = {}
for k = 1, #KEYS, 2 do
  local i = (k + 1) / 2
  local log, seq = KEYS[k], KEYS[k + 1]
  if not key_is(log, 'zset') then
    out[i] = {'', '', '', '', '', {}, log}
  elseif not key_is(seq, 'hash') then
    out[i] = {'', '', '', '', '', {}, seq}
  else
    local v = redis.call('HMGET', seq, 'seq', 'dropped')
    local top = redis.call('ZRANGE', log, -1, -1, 'WITHSCORES')
    local name = ARGV[1 + 2 * i]
    local seen = name ~= '' and redis.call('ZSCORE', log, name) or ''
    out[i] = {v[1] or '0', v[2] or '0', top[1] or '', top[2] or '0', seen or '',
              redis.call('ZRANGEBYSCORE', log, '(' .. ARGV[2 * i], '+inf', 'WITHSCORES',
                         'LIMIT', 0, limit + 1), ''}
  end
end
return cjson.encode(out)
