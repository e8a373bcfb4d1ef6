-- The check immediately before publish: only the holder of the current token may send.
-- A holder that checked before and lost the reply (a timeout) may check again: publishing
-- the same occurrence twice under one token is fenced at the worker.
-- KEYS: runs. ARGV: due, token, owner, task id.
-- Returns {1} or {0, why}.
local run = get_run(KEYS[1], ARGV[1])
if not run then return {0, 'missing'} end
if tostring(run.token) ~= ARGV[2] or run.owner ~= ARGV[3] then return {0, 'superseded'} end
if run.state ~= 'claimed' and run.state ~= 'sending' then return {0, run.state} end
run.state = 'sending'
run.task_id = ARGV[4]
run.sending_at = now_ms()
put_run(KEYS[1], ARGV[1], run)
return {1}
