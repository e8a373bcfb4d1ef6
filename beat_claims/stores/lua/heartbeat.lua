-- A beat is alive for ttl more: its record, its expiry, and the store's epoch. The epoch
-- changes when the store may have lost writes: it has none (new or wiped), the server is
-- another process than the one that started it (a restart, possibly from an older
-- snapshot, or a failover), or a caller found the store went back (resync). The first
-- heartbeat to see it starts the new epoch; then no beat claims until every live beat has
-- had one ttl to register what it knows (settle_until). Owners whose heartbeat lapsed long
-- ago are forgotten (their claims are found from the runs' own records, not from here).
-- The store's id (kept until it is wiped) is made here too, the first time. The epoch hash
-- keeps the instant of the last heartbeat of any beat (beat_at), answered as it was before
-- this one: a store put back from an older copy answers the copy's.
-- KEYS: owners hash, alive zset, epoch hash, store id. ARGV: owner id, owner JSON, ttl ms, resync
-- ('1'/'0'), a new epoch id, forget after ms, settling ('1': the caller is still
-- registering what it knows; a store that is settling stays so for ttl more), a new store id,
-- and on a cluster the run ids of the masters of every bucket and of these keys (sorted,
-- comma-separated: server.lua, just before; a restart or failover of any master is a new
-- epoch); on one server, the script reads its run id itself.
-- Returns, as one JSON string (one value for the client to read, not a dozen):
-- [now, epoch id, settle until or '', owners (flat id, JSON), alive (flat id, expiry), the
-- server's run id (the masters' on a cluster), the store's id, the last heartbeat before
-- this one or '', '1' when the owner's record was there before this heartbeat else '0',
-- when the epoch began or ''].
local now = now_ms()
local ttl = tonumber(ARGV[3])
-- A key of the wrong kind here would stop every beat: it is replaced (the owners come
-- back at their next heartbeat; an epoch replaced is a new epoch, as after a wipe).
for i, kind in ipairs({'hash', 'zset', 'hash', 'string'}) do
  if not key_is(KEYS[i], kind) then redis.call('DEL', KEYS[i]) end
end
local known = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) == 0  -- (0: a field updated)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
local server = ARGV[9] or string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
local epoch = redis.call('HMGET', KEYS[3], 'id', 'settle_until', 'server', 'beat_at', 'since')
local id, settle, since = epoch[1], tonumber(epoch[2]), tonumber(epoch[5] or '')
local last_beat = tonumber(epoch[4] or '')
redis.call('HSET', KEYS[3], 'beat_at', fmt(math.max(now, last_beat or now)))
if not id or epoch[3] ~= server or ARGV[4] == '1' then
  id = ARGV[5]
  -- Long enough for every beat the store knows alive to notice: until the latest of their
  -- heartbeats lapses (beats with a longer interval than the caller's), within reason.
  local until_ = now + ttl
  local latest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if latest[2] and tonumber(latest[2]) > until_ then
    until_ = math.min(tonumber(latest[2]), now + 10 * ttl)
  end
  if not settle or settle < until_ then settle = until_ end
  since = now
  redis.call('HSET', KEYS[3], 'id', id, 'settle_until', fmt(settle), 'since', fmt(now),
             'server', server)
elseif ARGV[7] == '1' and settle and settle > now and settle < now + ttl then
  settle = now + ttl
  redis.call('HSET', KEYS[3], 'settle_until', fmt(settle))
end
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf',
    '(' .. fmt(now - tonumber(ARGV[6])))) do
  redis.call('HDEL', KEYS[1], gone)
  redis.call('ZREM', KEYS[2], gone)
end
local store_id = redis.call('GET', KEYS[4])
if not store_id then
  store_id = ARGV[8]
  redis.call('SET', KEYS[4], store_id)
end
return cjson.encode({fmt(now), id, settle and fmt(settle) or '',
                     redis.call('HGETALL', KEYS[1]),
                     redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES'), server, store_id,
                     last_beat and fmt(last_beat) or '', known and '1' or '0',
                     since and fmt(since) or ''})
