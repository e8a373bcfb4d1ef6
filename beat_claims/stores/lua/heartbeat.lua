-- A beat is alive for ttl more: its record, its expiry, and the store's epoch. The epoch
-- changes when the store may have lost writes: it has none (new or wiped), the server is
-- another process than the one that started it (a restart, possibly from an older
-- snapshot, or a failover), or a caller found the store went back (resync). The first
-- heartbeat to see it starts the new epoch; then no beat claims until every live beat has
-- had one ttl to register what it knows (settle_until). Owners whose heartbeat lapsed long
-- ago are forgotten (their claims are found from the runs' own records, not from here).
-- KEYS: owners hash, alive zset, epoch hash. ARGV: owner id, owner JSON, ttl ms, resync
-- ('1'/'0'), a new epoch id, forget after ms.
-- Returns {now, epoch id, settle until or '', owners (flat id, JSON), alive (flat id, expiry)}.
local now = now_ms()
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
local server = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
local epoch = redis.call('HMGET', KEYS[3], 'id', 'settle_until', 'server')
local id, settle = epoch[1], tonumber(epoch[2])
if not id or epoch[3] ~= server or ARGV[4] == '1' then
  id = ARGV[5]
  if not settle or settle < now + ttl then settle = now + ttl end
  redis.call('HSET', KEYS[3], 'id', id, 'settle_until', fmt(settle), 'since', fmt(now),
             'server', server)
end
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf',
    '(' .. fmt(now - tonumber(ARGV[6])))) do
  redis.call('HDEL', KEYS[1], gone)
  redis.call('ZREM', KEYS[2], gone)
end
return {fmt(now), id, settle and fmt(settle) or '', redis.call('HGETALL', KEYS[1]),
        redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')}
