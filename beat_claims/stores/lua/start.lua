-- A worker is about to execute a delivery. Compare-and-set on the token: the first
-- delivery of the current token starts the run; a second one is refused, unless it is a
-- Celery retry (more retries than recorded) or the process that started the run is gone
-- (ARGV takeover names it, as the caller found it). A run presumed lost (no outcome within
-- run_timeout) whose delivery turns up late still runs: it was never sent again.
-- KEYS: runs, live, open, entry.
-- ARGV: due, token, worker, pid, retries, takeover ('' or 'worker|pid'), process start time.
-- Returns {'ok'} or {'refused', why} or {'busy', worker, pid, process start time}.
local run = get_run(KEYS[1], ARGV[1])
if run == nil then
  local checkpoint = redis.call('HGET', KEYS[4], 'checkpoint')
  if checkpoint and tonumber(ARGV[1]) <= tonumber(checkpoint) then
    return {'refused', 'no record of this run (trimmed from history, or the store was wiped)'}
  end
  return {'ok', 'untracked'}
end
if run == false then return {'ok', 'corrupt'} end
if tostring(run.token) ~= ARGV[2] then
  return {'refused', 'token ' .. ARGV[2] .. ' superseded by ' .. tostring(run.token)}
end
if FINAL[run.state] and run.state ~= 'lost' then return {'refused', 'already ' .. run.state} end
local retries = tonumber(ARGV[5])
local now = now_ms()
if run.state == 'started' or (run.state == 'lost' and run.started_at) then
  -- The same process only if its start time matches too: a restarted worker may get the
  -- same node name and pid.
  local same = run.worker == ARGV[3] and tostring(run.worker_pid) == ARGV[4]
      and math.abs((tonumber(run.worker_created) or 0) - tonumber(ARGV[7])) < 0.01
  local retry = retries > (run.retries or 0)
  local takeover = ARGV[6] ~= '' and ARGV[6] == (run.worker .. '|' .. tostring(run.worker_pid))
  if not (retry or takeover) then
    if same then return {'refused', 'already started by this process'} end
    return {'busy', run.worker, tostring(run.worker_pid), tostring(run.worker_created or 0)}
  end
  if takeover then run.deliveries = (run.deliveries or 1) + 1 end
elseif run.state == 'sending' or run.state == 'sent' or run.state == 'lost' then
  run.deliveries = 1
else
  return {'refused', 'not sent (' .. run.state .. ')'}
end
if run.state == 'lost' then
  -- Presumed lost, and it was not: its run_timeout counts again from now.
  run.revived = true
  run.revived_at = now
  run.finished_at = nil
end
run.state = 'started'
run.worker = ARGV[3]
run.worker_pid = tonumber(ARGV[4])
run.worker_created = tonumber(ARGV[7])
run.retries = retries
run.started_at = run.started_at or now
put_run(KEYS[1], ARGV[1], run)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], run.due, ARGV[1])
return {'ok'}
