-- The holder gives a claim back: the occurrence is due again, for any beat that has the
-- entry. With an error (the publish failed) the attempt is counted; at the limit the run
-- is recorded failed instead (publish_error), so a run that cannot be published does not
-- come back for ever.
-- KEYS: the entry's keys. ARGV: name, owner, token, due, error type, error message ('' for
-- a plain release), attempts allowed. Returns the run's new state, or '' if not released.
local K = entry_keys(KEYS, ARGV[1])
local run = get_run(K, ARGV[4])
if not run or not holds(run, ARGV[2], ARGV[3]) then
  return ''
end
local old = shallow_copy(run)
local now = now_ms()
if ARGV[6] ~= '' then
  run.attempts = (run.attempts or 0) + 1
  run.exc_type = ARGV[5]
  run.exc_message = ARGV[6]
  if run.attempts >= tonumber(ARGV[7]) then
    run.state = STATE.failed
    run.reason = REASON.publish_error
    run.finished_at = now
    put_run(K, run, old)
    return run.state
  end
end
to_due(run, run.owner, now)
put_run(K, run, old)
return run.state
