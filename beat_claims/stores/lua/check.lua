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
local old = shallow_copy(run)
local now = now_ms()
local reason = ARGV[6]
if reason == '' and not run.manual and paused_for(pause_of(K), run.due) then
  reason = REASON.paused  -- paused, or due in its last pause
end
local overlap = ARGV[7]
if reason == '' and run.state == STATE.claimed and overlap ~= OVERLAP.allow
    and not run.manual and busy_besides(K, due) then
  if overlap == OVERLAP.skip then
    reason = REASON.overlap
  elseif overlap == OVERLAP.buffer_one and busy_newer(K, due) then
    reason = REASON.overlap  -- a newer occurrence runs already: this one comes too late
  elseif overlap == OVERLAP.buffer_one then
    -- The newest waits; any other waiting run of the entry is skipped (the older one).
    for _, other in ipairs(redis.call('ZRANGE', K.due_e, 0, -1)) do
      local o = get_run(K, other)
      if o and o.state == STATE.waiting and other ~= due then
        if o.due > run.due then
          reason = REASON.overlap
        else
          skip_run(K, o, REASON.overlap, now)
        end
      end
    end
    if reason == '' then
      run.state = STATE.waiting
      run.waited_by = run.owner
      run.owner = nil
      run.waiting_at = now
      put_run(K, run, old)
      return CHECK.waiting
    end
  end
end
if reason ~= '' then
  run.state = STATE.skipped
  run.reason = reason
  run.finished_at = now
  put_run(K, run, old)
  return CHECK.skipped .. ';' .. reason
end
run.state = STATE.sending
run.task_id = ARGV[5]
run.sending_at = now
put_run(K, run, old)
return CHECK.send
