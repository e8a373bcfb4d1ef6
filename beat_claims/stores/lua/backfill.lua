-- An operator asks for past occurrences to run: each instant with no run, or whose run
-- ended without running (skipped, lost, cancelled), gets a manual run due now (as a
-- requested run): a beat claims it with a fresh token and sends it. Instants whose run
-- ran, runs or is on its way are kept as they are: among them a run presumed lost that a
-- worker started (it ran, or runs still, and may report). The checkpoint is not touched.
-- A backfill that would create more runs than the history holds beside the entry's
-- unfinished runs is refused, before anything is written (its runs could push runs sent
-- out of the history).
-- So is one with an instant that has no run recorded at or before the entry's history
-- horizon (the newest instant a trim removed the run of): whether it ran is not known.
-- KEYS: the entry's keys. ARGV: name, requested by, history limit, then the instants.
-- Returns {created instants, kept (instant, state) pairs}, {-1, runs it would create,
-- unfinished runs} or {-2, such instants, the horizon ('': it cannot be read)} when
-- refused, or {} for an unknown entry.
local K = entry_keys(KEYS, ARGV[1])
local e = get_entry(K)
if not e or not e.anchor then return {} end
local forgotten = beyond_horizon(K, ARGV, 4)
if forgotten then return forgotten end
local again = {[STATE.skipped] = true, [STATE.lost] = true, [STATE.cancelled] = true}
local limit = tonumber(ARGV[3])
local now = now_ms()
local created, kept, redo = {}, {}, {}
for i = 4, #ARGV do
  local due = ARGV[i]
  local run = get_run(K, due)
  if run == false then
    kept[#kept + 1] = due  -- a record that cannot be read: left for an operator
    kept[#kept + 1] = ''
  elseif run and (not again[run.state] or (run.state == STATE.lost and run.started_at)) then
    kept[#kept + 1] = due
    kept[#kept + 1] = run.state
  else
    created[#created + 1] = due
    redo[#created] = run
  end
end
if #created > 0 then
  local live = 0
  local dues = redis.call('ZRANGE', K.history, 0, -1)
  if #dues > 0 then
    for _, due in ipairs(dues) do
      local run = get_run(K, due)
      if run and not FINAL[run.state] then live = live + 1 end
    end
  end
  if live + #created > limit then return {-1, #created, live} end
end
for i, due in ipairs(created) do
  local run = redo[i]
  if run then
    forget_run(K, run)  -- its record and task id: the new run is another delivery
    redis.call('ZREM', K.lost, due)
  end
  put_run(K, {due = tonumber(due), state = STATE.due, manual = true,
              requested_by = ARGV[2], released_at = now}, nil)
  redis.call('ZADD', K.history, due, due)
end
trim(K, limit, now)
return {created, kept}
