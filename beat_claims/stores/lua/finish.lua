-- Record a run's outcome. A final state is never overwritten; a superseded token's outcome
-- is ignored; the entry's checkpoint is never touched.
-- KEYS: runs, live, open. ARGV: due, token ('' = the current one), state, exc type, message,
--       worker.
local run = get_run(KEYS[1], ARGV[1])
if not run then return 0 end
if ARGV[2] ~= '' and tostring(run.token) ~= ARGV[2] then return 0 end
if FINAL[run.state] then return 0 end
if run.state == 'claimed' or run.state == 'due' then return 0 end
run.state = ARGV[3]
run.finished_at = now_ms()
if ARGV[4] ~= '' then run.exc_type = ARGV[4] end
if ARGV[5] ~= '' then run.exc_message = ARGV[5] end
if ARGV[6] ~= '' and not run.worker then run.worker = ARGV[6] end
put_run(KEYS[1], ARGV[1], run)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
