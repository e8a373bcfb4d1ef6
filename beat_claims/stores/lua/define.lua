-- Change an entry's definition (Store.write_definitions): one compare-and-set on its
-- version (0: create, over no definition or a tombstone), and on its checkpoint when the
-- caller names the one it read. Then, in this one step: an entry that does not exist is
-- anchored (the caller's anchoring instant, as register anchors); the planned skips are
-- recorded as a claim records its own (instants after the checkpoint with no run yet); the
-- checkpoint moves forward only; the definition (or its tombstone), the version + 1, origin,
-- who and when are written; the entry's bucket's change log numbers the change, its
-- tombstones older than the caller's keep leave the log; the history is trimmed. The same
-- change id as the entry's last change answers as that change did, and writes nothing.
-- KEYS: the entry's definition keys. ARGV: name, anchor for a new entry, expected version,
-- definition, delete ('1'/'0'), origin, by, change id ('' none), checkpoint ('' leave it),
-- expected checkpoint ('' not checked), history limit, tombstones kept (ms), n, then n
-- pairs (due, skip reason), by due, then the entry's next due instant (-1 for a delete).
-- Returns, as one JSON string: [status, detail, anchor ('' none), checkpoint, token, and the
-- stored definition ('' when the write is written: the caller has it), version, origin,
-- changed by, changed at (false: none)].
local K = definition_keys(KEYS, ARGV[1])
local e, bad = get_entry(K)
if not e then return cjson.encode({WRITE.corrupt, bad}) end
local d
d, bad = definition_of(K)
if not d then return cjson.encode({WRITE.corrupt, bad}) end

local function answer(status, detail, written)
  local v = redis.call('HMGET', K.entry, 'definition', 'version', 'origin', 'changed_by',
                       'changed_at')
  return cjson.encode({status, detail, e.anchor and fmt(e.anchor) or '',
                       e.checkpoint and fmt(e.checkpoint) or '', e.token_text or '0',
                       written and '' or v[1], v[2], v[3], v[4], v[5]})
end

if ARGV[8] ~= '' and d.change_id == ARGV[8] then return answer(WRITE.ok, '', true) end
local expected = tonumber(ARGV[3])
if expected == 0 then
  if d.live then return answer(WRITE.exists, '') end
elseif not d.live then
  return answer(WRITE.missing, '')
elseif d.version ~= expected then
  return answer(WRITE.conflict, 'version')
end
if ARGV[10] ~= '' and (e.checkpoint == nil or fmt(e.checkpoint) ~= ARGV[10]) then
  return answer(WRITE.conflict, 'checkpoint')
end
local now = now_ms()
if not e.anchor then
  e.anchor = tonumber(ARGV[2])
  redis.call('HSET', K.entry, 'name', ARGV[1], 'anchor', fmt(e.anchor))
end
local cp, skipped = e.checkpoint, false
for i = 1, tonumber(ARGV[13]) do
  local due, reason = ARGV[12 + 2 * i], ARGV[13 + 2 * i]
  local due_n = tonumber(due)
  if cp == nil or due_n > cp then
    cp = due_n
    if redis.call('HEXISTS', K.runs, due) == 0 then
      put_skipped(K, due_n, reason, now)
      skipped = true
    end
  end
end
local to = tonumber(ARGV[9])
if to and (cp == nil or to > cp) then cp = to end
if cp ~= e.checkpoint then
  e.checkpoint = cp
  redis.call('HSET', K.entry, 'checkpoint', fmt(cp))
end
if ARGV[5] == '1' then
  redis.call('HDEL', K.entry, 'definition')
  redis.call('ZADD', K.gone, now, ARGV[1])
else
  redis.call('HSET', K.entry, 'definition', ARGV[4])
  redis.call('ZREM', K.gone, ARGV[1])
end
redis.call('HSET', K.entry, 'version', fmt(d.version + 1), 'origin', ARGV[6],
           'changed_by', ARGV[7], 'changed_at', fmt(now))
if ARGV[8] ~= '' then
  redis.call('HSET', K.entry, 'change_id', ARGV[8])
else
  redis.call('HDEL', K.entry, 'change_id')
end
set_next(K, ARGV[14 + 2 * tonumber(ARGV[13])])
redis.call('ZADD', K.log, fmt(next_seq(K, now)), ARGV[1])
redis.call('ZADD', K.named, 0, ARGV[1])
drop_tombstones(K, now - tonumber(ARGV[12]))
if skipped then trim(K, tonumber(ARGV[11]), now) end
return answer(WRITE.ok, '', true)
