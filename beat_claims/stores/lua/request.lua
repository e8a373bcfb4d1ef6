-- An operator asks for a run now: a new occurrence at the store's clock (the first free
-- millisecond), recorded 'due' (as a released run is), so a beat that has the entry claims
-- it with a fresh token and sends it like any other. The checkpoint is not touched:
-- scheduled occurrences are neither skipped nor moved by a manual run.
-- A request id seen before (the caller asking again after a lost reply) records nothing.
-- KEYS: the entry's keys. ARGV: name, requested by, history limit, request id ('' none).
-- Returns the due instant, or '' when the store does not know the entry.
local K = entry_keys(KEYS, ARGV[1])
local e = get_entry(K)
if not e or not e.anchor then return '' end
if ARGV[4] ~= '' then
  for _, seen in ipairs(redis.call('ZRANGE', K.history, 0, -1)) do
    local run = get_run(K, seen)
    if run and run.request_id == ARGV[4] then return seen end
  end
end
local due = now_ms()
while redis.call('HEXISTS', K.runs, fmt(due)) == 1 do due = due + 1 end
put_run(K, {due = due, state = STATE.due, manual = true, requested_by = ARGV[2],
            released_at = due, request_id = ARGV[4] ~= '' and ARGV[4] or nil}, nil)
redis.call('ZADD', K.history, due, fmt(due))
trim(K, tonumber(ARGV[3]), due)
return fmt(due)
