-- The check immediately before publish: only the holder of the current token may send.
-- It marks the run 'sending' with its task id, or records it skipped (the caller's reason,
-- or 'overlap' when the entry's policy is to skip while another run of it is being sent,
-- sent or started). A holder that checked before and lost the reply may check again, and
-- gets the same answer.
-- KEYS: the entry's keys. ARGV: name, owner, token, due, task id, skip reason ('' none),
-- overlap policy. Returns {'send'}, {'skipped', reason} or {'refused', why}.
local K = entry_keys(KEYS, ARGV[1])
local due = ARGV[4]
local run = get_run(K, due)
if run == nil then return {CHECK.missing, 'no such run'} end
if run == false then return {CHECK.refused, 'unreadable record'} end
if run.owner ~= ARGV[2] or not has_token(run, ARGV[3]) then
  return {CHECK.refused, 'superseded'}
end
if run.state == STATE.skipped and REASON[run.reason] then
  return {CHECK.skipped, run.reason}  -- skipped by this holder's check: asked again
end
if not HELD[run.state] then return {CHECK.refused, run.state} end
local old = shallow_copy(run)
local now = now_ms()
local reason = ARGV[6]
if reason == '' and ARGV[7] == OVERLAP.skip and run.state == STATE.claimed then
  for _, other in ipairs(redis.call('ZRANGE', K.busy_e, 0, -1)) do
    if other ~= due then
      local o = get_run(K, other)
      -- A run registered again after a wipe as sent, that no worker has started since,
      -- may well be finished: it does not make the next ones overlap.
      if o and (o.state == STATE.sending or OPEN[o.state])
          and not (o.reseeded and o.state == STATE.sent) then
        reason = REASON.overlap
        break
      end
    end
  end
end
if reason ~= '' then
  run.state = STATE.skipped
  run.reason = reason
  run.finished_at = now
  put_run(K, run, old)
  return {CHECK.skipped, reason}
end
run.state = STATE.sending
run.task_id = ARGV[5]
run.sending_at = now
put_run(K, run, old)
return {CHECK.send}
