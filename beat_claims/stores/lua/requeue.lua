-- The delivery that started a run gives it back without an outcome: its message goes back
-- to the broker (Reject(requeue=True)), or to the task that replaces it. Only that
-- delivery's process may, with the current token: the run is sent again, and the next
-- delivery of its token starts it.
-- KEYS: the entry's keys. ARGV: name, due, token, worker, pid, process identity.
-- Returns 1 if given back.
local K = entry_keys(KEYS, ARGV[1])
local run = get_run(K, ARGV[2])
if not run or run.state ~= STATE.started or not has_token(run, ARGV[3]) then return 0 end
if run.worker ~= ARGV[4] or fmt(run.worker_pid or -1) ~= ARGV[5]
    or (run.worker_process or '') ~= ARGV[6] then
  return 0
end
local old = shallow_copy(run)
run.state = STATE.sent
run.requeues = (run.requeues or 0) + 1
run.worker, run.worker_pid, run.worker_process = nil, nil, nil
run.revived_at = now_ms()  -- its run_timeout counts again from now (since() reads it)
put_run(K, run, old)
return 1
