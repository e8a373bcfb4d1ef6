-- Claim (or record skipped) the next occurrences of one entry, and take its due runs.
-- One compare-and-set: the caller computed the occurrences from the anchor and checkpoint
-- it believes in; if the store holds others, nothing is written and the store's are
-- returned. The checkpoint only moves forward; a fresh token for each claim, above the
-- caller's floor; an instant that already has a run is left as it is (and reported).
-- With an overlap policy (ARGV[8]; '' = none), each new claim is also checked before
-- publish at once, as check.lua would check it right after (the caller publishes next):
-- marked being sent with its task id, or recorded skipped or waiting; not while the entry
-- has runs due again (then none is checked here).
-- claim_one's KEYS: the entry's keys. Its ARGV: name, owner, expected anchor ('' = no new
-- occurrences), expected checkpoint ('' none), token floor, take due runs ('1'/'0'), history limit,
-- overlap policy to check new claims with ('' = do not check them), n, then n triples
-- (due, 'claim' or a skip reason, task id: '' unless checked), then the entry's next due
-- instant ('' = leave the due index as it is) and the definition version it was computed
-- from ('' = not checked): written with the checkpoint, only if the compare-and-set passed.
-- It returns one string of ';'-separated fields (a flat reply costs the client far less to
-- read than nested arrays): 'ok;anchor;checkpoint;token;claimed;skipped;existing;taken;
-- unreadable;checked', each list ','-separated (claimed: due, token pairs; skipped: due,
-- reason pairs; taken: due, token, manual, maybe sent, attempts; checked: due, verdict,
-- reason triples, of the new claims checked), or 'conflict;anchor;checkpoint;token',
-- 'missing', 'corrupt;field'.
local function claim_one(KEYS, ARGV)
  local K = entry_keys(KEYS, ARGV[1])
  local owner = ARGV[2]
  local e, bad = get_entry(K)
  if not e then return CLAIM.corrupt .. ';' .. bad end
  if not e.anchor then return CLAIM.missing end
  local cp_text = e.checkpoint and fmt(e.checkpoint) or ''
  local now = now_ms()
  -- (a token is never below the clock: a store put back from an older copy hands none out twice)
  local floor = math.max(tonumber(ARGV[5]), now * TOKENS_PER_MS - 1)
  local pause = e.pause
  -- The entry's token counter as this call leaves it (each next_token() is its new value).
  local token_text = e.token_text or '0'
  local claimed, skipped, existing, taken, unreadable, checked = {}, {}, {}, {}, {}, {}
  -- The entry's runs due again (released, requested, waiting), read once: the claims below
  -- add to them only runs that wait on (made waiting by their check), which the take below
  -- would leave waiting. Checked with the claim only while there are none: they are taken
  -- below, and checked in due order with the new ones by the caller's own check, as the
  -- overlap policies need.
  local take_due = ARGV[6] == '1'
  local check_with = ARGV[8]
  local dues = {}
  if take_due or check_with ~= '' then
    dues = redis.call('ZRANGE', K.due_e, 0, -1)
    K.no_due = #dues == 0  -- (until put_run puts a run there: see place_waiting)
  end
  if #dues > 0 then check_with = '' end
  if ARGV[3] ~= '' then
    if fmt(e.anchor) ~= ARGV[3] or cp_text ~= ARGV[4] then
      return table.concat({CLAIM.conflict, fmt(e.anchor), cp_text, fmt(e.token)}, ';')
    end
    local cp = e.checkpoint
    for i = 1, tonumber(ARGV[9]) do
      local due, action, task_id = ARGV[7 + 3 * i], ARGV[8 + 3 * i], ARGV[9 + 3 * i]
      local due_n = tonumber(due)
      if cp == nil or due_n > cp then
        cp = due_n
        if redis.call('HEXISTS', K.runs, due) == 1 then
          existing[#existing + 1] = due
        elseif action == 'claim' and paused_for(pause, due_n) then
          put_skipped(K, due_n, REASON.paused, now)
          skipped[#skipped + 1] = due
          skipped[#skipped + 1] = REASON.paused
        elseif action == 'claim' then
          local token = next_token(K, floor)
          floor = token
          token_text = fmt(token)
          local run = {due = due_n, state = STATE.claimed, token = token, owner = owner,
                       claimed_at = now}
          if check_with ~= '' then
            local verdict, reason = string.match(
              check_run(K, run, nil, task_id, '', check_with, pause, now), '^([^;]*);?(.*)$')
            checked[#checked + 1] = due
            checked[#checked + 1] = verdict
            checked[#checked + 1] = reason
          else
            put_run(K, run, nil)
          end
          redis.call('ZADD', K.history, due_n, due)
          claimed[#claimed + 1] = due
          claimed[#claimed + 1] = fmt(token)
        else
          put_skipped(K, due_n, action, now)
          skipped[#skipped + 1] = due
          skipped[#skipped + 1] = action
        end
      end
    end
    if cp ~= nil and cp ~= e.checkpoint then
      cp_text = fmt(cp)
      redis.call('HSET', K.entry, 'checkpoint', cp_text)
    end
    local n = tonumber(ARGV[9])
    if version_is(K, ARGV[11 + 3 * n]) then set_next(K, ARGV[10 + 3 * n]) end
  end
  if take_due then
    for _, due in ipairs(dues) do
      local run = get_run(K, due)
      if run == false then
        drop_bad(K, due)
        unreadable[#unreadable + 1] = due
      elseif run == nil or (run.state ~= STATE.due and run.state ~= STATE.waiting) then
        redis.call('ZREM', K.due_e, due)  -- an index entry with no run behind it
      elseif not run.manual and paused_for(pause, run.due) then
        skip_run(K, run, REASON.paused, now)
        skipped[#skipped + 1] = due
        skipped[#skipped + 1] = REASON.paused
      elseif run.state == STATE.waiting and busy_besides(K, due) then
        -- overlap="buffer_one": it waits on, until the entry's unfinished run is final
      else
        local old = shallow_copy(run)
        run.token = next_token(K, floor)
        floor = run.token
        token_text = fmt(run.token)
        run.state = STATE.claimed
        run.owner = owner
        run.claimed_at = now
        run.sending_at = nil  -- the previous holder's check: this claim is held since now
        run.waiting_at, run.waited_by = nil, nil
        put_run(K, run, old)
        taken[#taken + 1] = due
        taken[#taken + 1] = fmt(run.token)
        taken[#taken + 1] = run.manual and '1' or '0'
        taken[#taken + 1] = run.maybe_sent and '1' or '0'
        taken[#taken + 1] = fmt(run.attempts or 0)
      end
    end
  end
  trim(K, tonumber(ARGV[7]), now)
  return table.concat({CLAIM.ok, fmt(e.anchor), cp_text, token_text,
                       table.concat(claimed, ','), table.concat(skipped, ','),
                       table.concat(existing, ','), table.concat(taken, ','),
                       table.concat(unreadable, ','), table.concat(checked, ',')}, ';')
end

-- Many entries in one call (on Redis Cluster, of one bucket: one slot): KEYS and ARGV as
-- each_entry takes them, the owner the one argument shared (claim_one's ARGV[2]), each
-- entry's own the rest of claim_one's; their replies '\n'-separated, in order.
return table.concat(each_entry(KEYS, ARGV, 1, claim_one), '\n')
