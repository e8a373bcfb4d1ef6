-- An operator pauses an entry: from now on its scheduled runs are recorded skipped
-- ('paused') by the claim and the check before publish. Pausing a paused entry keeps its
-- instant and takes the new note and who.
-- KEYS: the entry's keys. ARGV: name, by, note.
-- Returns {paused at, by, note}, or {} when the store does not know the entry.
local K = entry_keys(KEYS, ARGV[1])
if redis.call('HEXISTS', K.entry, 'anchor') == 0 then return {} end
local at = redis.call('HGET', K.entry, 'paused_at')
if not at or not tonumber(at) then
  at = fmt(now_ms())
  redis.call('HSET', K.entry, 'paused_at', at)
end
redis.call('HSET', K.entry, 'paused_by', ARGV[2], 'paused_note', ARGV[3])
place_waiting(K)  -- a claim records them skipped now: the sweeps report them
return {at, ARGV[2], ARGV[3]}
