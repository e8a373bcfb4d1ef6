-- Take a held claim back from its holder (dead, too slow, or an operator's release): the
-- occurrence is due again and its next claim gets a fresh token, so the holder's check
-- before publish refuses it. A run that was being sent may have been published: that is
-- remembered, and the worker's fencing runs the occurrence once.
-- A record that cannot be read is taken out of the indexes (else every sweep would find
-- it again, for ever) and reported.
-- KEYS: the entry's keys. ARGV: name, due, token ('' any), by. Returns 1 if taken back, -1
-- for an unreadable record, else 0.
local K = entry_keys(KEYS, ARGV[1])
local run = get_run(K, ARGV[2])
if run == false then
  drop_bad(K, ARGV[2])
  return -1
end
if not run or not HELD[run.state] then return 0 end
if not has_token(run, ARGV[3]) then return 0 end
local old = shallow_copy(run)
if run.state == STATE.sending then run.maybe_sent = true end
run.reclaimed_from = run.owner
run.reclaims = (run.reclaims or 0) + 1
to_due(run, ARGV[4], now_ms())
put_run(K, run, old)
return 1
