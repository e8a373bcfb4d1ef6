-- The holder of a claim decides by policy not to send it: record it skipped.
-- KEYS: runs, live. ARGV: due, token, owner, reason.
local run = get_run(KEYS[1], ARGV[1])
if not run or tostring(run.token) ~= ARGV[2] or run.owner ~= ARGV[3]
    or run.state ~= 'claimed' then
  return 0
end
run.state = 'skipped'
run.reason = ARGV[4]
run.finished_at = now_ms()
put_run(KEYS[1], ARGV[1], run)
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
