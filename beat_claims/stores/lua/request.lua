-- An operator asks for a run now: a new occurrence at the store's clock (the first free
-- millisecond), recorded 'due' (as a released run is), so a beat that has the entry claims
-- it with a fresh token and sends it like any other. The checkpoint is not touched:
-- scheduled occurrences are neither skipped nor moved by a manual run.
-- KEYS: the entry's keys. ARGV: name, requested by, history limit.
-- Returns the due instant, or '' when the store does not know the entry.
local K = entry_keys(KEYS, ARGV[1])
local e = get_entry(K)
if not e or not e.anchor then return '' end
local due = now_ms()
while redis.call('HEXISTS', K.runs, fmt(due)) == 1 do due = due + 1 end
put_run(K, {due = due, state = STATE.due, manual = true, requested_by = ARGV[2],
            released_at = due}, nil)
redis.call('ZADD', K.history, due, fmt(due))
trim(K, tonumber(ARGV[3]), due)
return fmt(due)
