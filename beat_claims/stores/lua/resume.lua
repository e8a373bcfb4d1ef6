-- An operator ends an entry's pause, recording who and when. An entry that is not paused
-- is left as it is.
-- KEYS: the entry's keys. ARGV: name, by. Returns 1, 0 (not paused), or -1 (unknown).
local K = entry_keys(KEYS, ARGV[1])
if redis.call('HEXISTS', K.entry, 'anchor') == 0 then return -1 end
if redis.call('HEXISTS', K.entry, 'paused_at') == 0 then return 0 end
redis.call('HDEL', K.entry, 'paused_at', 'paused_by', 'paused_note')
redis.call('HSET', K.entry, 'resumed_by', ARGV[2], 'resumed_at', fmt(now_ms()))
place_waiting(K)  -- they wait on again while a run of the entry overlaps
return 1
