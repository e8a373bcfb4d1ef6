-- Record a run's outcome. A final state is never overwritten, but for a run presumed lost
-- that a worker started: the outcome of that execution, reported late, is recorded (the
-- run is back in the history). A superseded token's outcome is ignored; the entry's
-- checkpoint is never touched. A presumption of loss (a sweep's) applies only to a run
-- sent or started, not active since the caller's cutoff.
-- KEYS: the entry's keys. ARGV: name, due, token ('' = the current one), state, reason,
-- exc type, exc message, worker, inactive since ('' none), unstarted only ('1': not if a
-- delivery started the run). Returns 1 if recorded.
local K = entry_keys(KEYS, ARGV[1])
local run = get_run(K, ARGV[2])
if not run then return 0 end
local late = run.state == STATE.lost and run.started_at ~= nil
if not has_token(run, ARGV[3]) or (FINAL[run.state] and not late) or not handed_over(run) then
  return 0
end
if ARGV[10] == '1' and (run.state == STATE.started or late) then return 0 end
if ARGV[4] == STATE.lost then
  if not OPEN[run.state] then return 0 end
  local cutoff = tonumber(ARGV[9])
  if cutoff and since(run) >= cutoff then return 0 end
end
local old = shallow_copy(run)
if late then
  -- Presumed lost, and it was not: its reason (run_timeout) no longer holds.
  run.reason = nil
  run.revived = true
  if redis.call('ZSCORE', K.lost, ARGV[2]) then
    redis.call('ZREM', K.lost, ARGV[2])
    redis.call('ZADD', K.history, run.due, ARGV[2])
  end
end
run.state = ARGV[4]
run.finished_at = now_ms()
if ARGV[5] ~= '' then run.reason = ARGV[5] end
if ARGV[6] ~= '' then run.exc_type = ARGV[6] end
if ARGV[7] ~= '' then run.exc_message = ARGV[7] end
if ARGV[8] ~= '' and not run.worker then run.worker = ARGV[8] end
put_run(K, run, old)
return 1
