-- An operator releases a stuck claim, whoever holds it: the run is due again and the next
-- claim gives it a fresh token, so the old holder's check before publish refuses it (and,
-- if it had already passed that check, the worker's fencing runs the occurrence once).
-- KEYS: runs. ARGV: due, released by. Returns 1 if released.
local run = get_run(KEYS[1], ARGV[1])
if not run or (run.state ~= 'claimed' and run.state ~= 'sending') then return 0 end
run.released_by = ARGV[2]
run.released_from = run.owner
run.owner = nil
run.state = 'due'
run.released_at = now_ms()
put_run(KEYS[1], ARGV[1], run)
return 1
