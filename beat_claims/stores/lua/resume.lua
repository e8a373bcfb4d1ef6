-- An operator ends an entry's pause, recording who and when, and when the pause began
-- (last_paused_at: the occurrences due in [last_paused_at, resumed_at) stay skipped when
-- claimed or checked after the resume). An entry that is not paused is left as it is.
-- KEYS: the entry's keys. ARGV: name, by. Returns 1, 0 (not paused), or -1 (unknown).
local K = entry_keys(KEYS, ARGV[1])
if redis.call('HEXISTS', K.entry, 'anchor') == 0 then return -1 end
local at = redis.call('HGET', K.entry, 'paused_at')
if not at then return 0 end
redis.call('HDEL', K.entry, 'paused_at', 'paused_by', 'paused_note')
redis.call('HSET', K.entry, 'resumed_by', ARGV[2], 'resumed_at', fmt(now_ms()))
if tonumber(at) then
  redis.call('HSET', K.entry, 'last_paused_at', at)
else
  redis.call('HDEL', K.entry, 'last_paused_at')  -- an unreadable instant: no interval
end
place_waiting(K)  -- they wait on again while a run of the entry overlaps
return 1
