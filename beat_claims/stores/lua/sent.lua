-- The publish succeeded. The worker may already have started (or finished) the run.
-- KEYS: runs, live, open. ARGV: due, token.
local run = get_run(KEYS[1], ARGV[1])
if not run or tostring(run.token) ~= ARGV[2] then return 0 end
if run.state == 'sending' then
  run.state = 'sent'
  redis.call('ZADD', KEYS[3], run.due, ARGV[1])
elseif run.state == 'claimed' or run.state == 'due' then
  return 0
end
if not run.sent_at then run.sent_at = now_ms() end
put_run(KEYS[1], ARGV[1], run)
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
