-- (Re)index an entry (Store.index): its next due instant, written only if the entry still
-- has the anchor, checkpoint and definition version it was computed from.
-- KEYS: the entry's keys. ARGV: name, anchor, checkpoint ('' none), version, next due
-- (ms >= 0, or -1: not due). Returns 1 if written, 0 if not (moved, no such entry, or a
-- field that cannot be read). A member of the due index whose entry is gone (keys put
-- back one by one from copies of different ages) leaves the index.
local K = entry_keys(KEYS, ARGV[1])
local e = get_entry(K)
if e and not e.anchor and redis.call('EXISTS', K.entry) == 0 then
  redis.call('ZREM', K.next, K.name)
end
if not e or not e.anchor then return 0 end
if fmt(e.anchor) ~= ARGV[2] or (e.checkpoint and fmt(e.checkpoint) or '') ~= ARGV[3]
    or not version_is(K, ARGV[4]) then
  return 0
end
set_next(K, ARGV[5])
return 1
