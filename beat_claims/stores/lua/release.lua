-- A stopping beat gives back what it claimed and did not send: those occurrences are due
-- again. Only the owner may release. With no due given, every claim the owner holds in the
-- entry that never reached the check before publish; with a due, that one claim even past
-- the check (its publish failed).
-- KEYS: runs, live. ARGV: owner, due or ''.
local released = 0
local dues = ARGV[2] ~= '' and {ARGV[2]} or redis.call('ZRANGE', KEYS[2], 0, -1)
for _, due in ipairs(dues) do
  local run = get_run(KEYS[1], due)
  if run and run.owner == ARGV[1]
      and (run.state == 'claimed' or (ARGV[2] ~= '' and run.state == 'sending')) then
    run.state = 'due'
    run.released_by = run.owner
    run.owner = nil
    run.released_at = now_ms()
    put_run(KEYS[1], due, run)
    released = released + 1
  end
end
return released
