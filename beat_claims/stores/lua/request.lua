-- An operator asks for a run now: a new occurrence at the store's clock, recorded 'due'
-- (as a released run is), so a beat that has the entry claims it with a fresh token and
-- sends it like any other occurrence. The checkpoint is not touched: scheduled
-- occurrences are neither skipped nor moved by a manual run.
-- KEYS: entry, runs, history, live. ARGV: requested by.
-- Returns the due instant, or '' when the store does not know the entry.
if redis.call('HEXISTS', KEYS[1], 'anchor') == 0 then return '' end
local due = now_ms()
while redis.call('HEXISTS', KEYS[2], tostring(due)) == 1 do due = due + 1 end
local key = string.format('%d', due)
put_run(KEYS[2], key, {due = due, state = 'due', manual = true, requested_by = ARGV[1],
                       released_at = due})
redis.call('ZADD', KEYS[3], due, key)
redis.call('ZADD', KEYS[4], due, key)
return key
