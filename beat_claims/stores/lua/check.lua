-- The check immediately before publish: only the holder of the current token may send.
-- It marks the run 'sending' with its task id, or records it skipped (the caller's reason,
-- 'paused' for a scheduled run of a paused entry or due in its last pause, or 'overlap' when the entry's policy is
-- to skip while another run of it is being sent, sent or started), or, with overlap
-- "buffer_one", waiting until that run is final (or skipped, 'overlap', when a newer
-- scheduled run of the entry is the one being sent, sent or started: it comes too late). A holder that checked before and lost
-- the reply may check again, and gets the same answer.
-- KEYS: the entry's keys. ARGV: name, owner, token, due, task id, skip reason ('' none),
-- overlap policy. Returns one string: 'send', 'skipped;reason', 'waiting', 'refused;why' or
-- 'missing;why'.
local K = entry_keys(KEYS, ARGV[1])
local due = ARGV[4]
local run = get_run(K, due)
if run == nil then return CHECK.missing .. ';no such run' end
if run == false then return CHECK.refused .. ';unreadable record' end
if run.state == STATE.waiting and run.waited_by == ARGV[2] and has_token(run, ARGV[3]) then
  -- made waiting by this holder's check: asked again (whatever overlap policy it asks
  -- with now), the same answer
  return CHECK.waiting
end
if run.owner ~= ARGV[2] or not has_token(run, ARGV[3]) then
  return CHECK.refused .. ';superseded'
end
if run.state == STATE.skipped and REASON[run.reason] then
  return CHECK.skipped .. ';' .. run.reason  -- skipped by this holder's check: asked again
end
if not HELD[run.state] then return CHECK.refused .. ';' .. run.state end
return check_run(K, run, shallow_copy(run), ARGV[5], ARGV[6], ARGV[7], pause_of(K),
                 now_ms())
