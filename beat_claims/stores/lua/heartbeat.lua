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
-- The caller's continuity (a running beat's: the epoch it saw, the store's clock then, and
-- whether its record was renewed within a TTL) is judged in this same step: when the store
-- went back (its newest writes lost, its record missing, an epoch that began before its
-- last heartbeat while it saw another, a last heartbeat of any beat, beat_at, before the
-- caller's: a copy taken before it) the epoch changes here, with this renewal, so that no
-- beat reads the renewal without it. On one server the writes are looked for here
-- (write_kept); on a cluster the client looked for them a round trip before (ARGV[13]).
-- KEYS: owners hash, alive zset, epoch hash, store id, then on one server each written
-- item's eleven entry keys. ARGV: owner id, owner JSON, ttl ms, resync ('1'/'0'), a new
-- epoch id, forget after ms, settling ('1': the caller is still registering what it knows;
-- a store that is settling stays so for ttl more), a new store id, on a cluster the run ids
-- of the masters of every bucket and of these keys (sorted, comma-separated: server.lua,
-- just before; a restart or failover of any master is a new epoch; '' on one server: the
-- script reads its run id itself), the continuity's epoch ('' for none), its clock, '1'
-- when its record was renewed within a TTL, '1' when the client found a write lost, then
-- each written item's name, due, token, kind, '1' when it is confirmed (Written) and its
-- entry's anchor ('' not known).
-- Returns, as one JSON string (one value for the client to read, not a dozen):
-- [now, epoch id, settle until or '', owners (flat id, JSON), alive (flat id, expiry), the
-- server's run id (the masters' on a cluster), the store's id, the last heartbeat before
-- this one or '', '1' when the owner's record was there before this heartbeat else '0',
-- when the epoch began or '', each written item's kept reply ('1', '0', '', 'r'), '1' when
-- the store went back (a new epoch begun for it) else '0'].
local now = now_ms()
local ttl = tonumber(ARGV[3])
-- A key of the wrong kind here would stop every beat: it is replaced (the owners come
-- back at their next heartbeat; an epoch replaced is a new epoch, as after a wipe).
for i, kind in ipairs({'hash', 'zset', 'hash', 'string'}) do
  if not key_is(KEYS[i], kind) then redis.call('DEL', KEYS[i]) end
end
local known = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) == 0  -- (0: a field updated)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
local server = ARGV[9] ~= '' and ARGV[9]
  or string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
local epoch = redis.call('HMGET', KEYS[3], 'id', 'settle_until', 'server', 'beat_at', 'since')
local id, settle, since = epoch[1], tonumber(epoch[2]), tonumber(epoch[5] or '')
local last_beat = tonumber(epoch[4] or '')
redis.call('HSET', KEYS[3], 'beat_at', fmt(math.max(now, last_beat or now)))
local kept, lost = {}, ARGV[13] == '1'
local a = 14
while a + 5 <= #ARGV do
  local first = 4 + 11 * (#kept)
  local K = entry_keys({unpack(KEYS, first + 1, first + 11)}, ARGV[a])
  local ok, reply = pcall(write_kept, K, ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
                          ARGV[a + 5])
  kept[#kept + 1] = ok and reply or ''  -- (a record of a wrong type: not judged)
  lost = lost or kept[#kept] == '0'
  a = a + 6
end
local went_back = ARGV[10] ~= '' and ARGV[4] ~= '1' and ARGV[7] ~= '1' and (
  lost or (ARGV[12] == '1' and not known)
  or (id and id ~= ARGV[10] and since and since < tonumber(ARGV[11]))
  or (last_beat and last_beat < tonumber(ARGV[11])))
if not id or epoch[3] ~= server or ARGV[4] == '1' or went_back then
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
                     since and fmt(since) or '', kept, went_back and '1' or '0'})
