-- The publish succeeded. The worker may already have started (or finished) the run.
-- KEYS: the entry's keys. ARGV: name, token, due. Returns 1 if recorded.
local K = entry_keys(KEYS, ARGV[1])
local run = get_run(K, ARGV[3])
if not run or not has_token(run, ARGV[2]) or not handed_over(run) then return 0 end
if run.state == STATE.sending then
  local old = shallow_copy(run)
  run.state = STATE.sent
  run.sent_at = now_ms()
  put_run(K, run, old)
elseif not run.sent_at then
  run.sent_at = now_ms()
  redis.call('HSET', K.runs, ARGV[3], cjson.encode(run))
end
return 1
