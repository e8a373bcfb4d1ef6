-- The publish succeeded. The worker may already have started (or finished) the run.
-- sent_one's KEYS: the entry's keys. Its ARGV: name, token, due; it returns 1 if recorded.
-- Many entries in one call (on Redis Cluster, of one bucket: one slot), KEYS and ARGV as
-- each_entry takes them (no argument shared): their replies '\n'-separated, in order.
local function sent_one(KEYS, ARGV)
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
end

return table.concat(each_entry(KEYS, ARGV, 0, sent_one), '\n')
