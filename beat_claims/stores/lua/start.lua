-- A worker is about to execute a delivery. Compare-and-set on the token: the first
-- delivery of the current token starts the run; a second one is refused, unless it is a
-- Celery retry (more retries than recorded) or the process that started the run is gone
-- (ARGV takeover names it, as the caller found it). A run presumed lost (no outcome within
-- run_timeout) whose delivery turns up late still runs: it was never sent again.
-- A delivery that runs indexes its task id (for signals that carry only that), in the
-- entry's bucket, so that the id goes when the run leaves the history.
-- KEYS: the entry's keys. ARGV: name, due, token, worker, pid, retries, takeover ('' or
-- 'worker|pid'), process identity, task id ('' none).
-- Returns {'run'}, {'untracked', why}, {'refused', why} or {'busy', worker, pid, started}.
local K = entry_keys(KEYS, ARGV[1])
local due = ARGV[2]
local run = get_run(K, due)
if run == nil then
  local e = get_entry(K)
  if e and e.checkpoint and tonumber(due) <= e.checkpoint then
    return {START.refused, 'no record of this run (trimmed from history, or the store was wiped)'}
  end
  return {START.untracked, 'no record of this run yet'}
end
if run == false then return {START.untracked, 'corrupt record'} end
if not has_token(run, ARGV[3]) then
  return {START.refused, 'token ' .. ARGV[3] .. ' superseded by ' .. fmt(run.token or 0)}
end
if FINAL[run.state] and run.state ~= STATE.lost then
  return {START.refused, 'already ' .. run.state}
end
local retries = tonumber(ARGV[6])
local now = now_ms()
local old = shallow_copy(run)
if run.state == STATE.started or (run.state == STATE.lost and run.started_at) then
  -- The same process only if its start time matches too: a restarted worker may get the
  -- same node name and pid.
  local same = run.worker == ARGV[4] and fmt(run.worker_pid or -1) == ARGV[5]
      and (run.worker_process or '') == ARGV[8]
  local retry = retries > (run.retries or 0)
  local takeover = ARGV[7] ~= '' and ARGV[7] == ((run.worker or '') .. '|'
      .. fmt(run.worker_pid or -1))
  if not (retry or takeover) then
    if same then return {START.refused, 'already started by this process'} end
    return {START.busy, run.worker or '', fmt(run.worker_pid or 0),
            run.worker_process or ''}
  end
  if takeover then run.deliveries = (run.deliveries or 1) + 1 end
elseif run.state == STATE.sending or run.state == STATE.sent or run.state == STATE.lost then
  run.deliveries = 1
else
  return {START.refused, 'not sent (' .. run.state .. ')'}
end
if run.state == STATE.lost then
  -- Presumed lost, and it was not: its run_timeout counts again from now.
  run.revived = true
  run.revived_at = now
  run.finished_at = nil
  run.reason = nil
  redis.call('ZREM', K.lost, due)
  redis.call('ZADD', K.history, run.due, due)
end
run.state = STATE.started
run.reseeded = nil
run.worker = ARGV[4]
run.worker_pid = tonumber(ARGV[5])
run.worker_process = ARGV[8]
run.retries = retries
run.started_at = run.started_at or now
if ARGV[9] ~= '' then run.task_id = ARGV[9] end  -- what the task-id index points from
put_run(K, run, old)
if ARGV[9] ~= '' then
  redis.call('HSET', K.tasks, ARGV[9], cjson.encode({entry = K.name, due = run.due,
                                                     token = run.token}))
end
return {START.run}
