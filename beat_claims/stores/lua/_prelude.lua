-- Shared by every script (prepended, after the generated table of names: STATE, FINAL,
-- HELD, OPEN, REASON, OVERLAP, the replies CLAIM, CHECK and START, and LOST_KEEP_MS).
--
-- Entry scripts get the entry's keys in this order (see entry_keys in redis.py):
--   1 entry hash, 2 runs hash, 3 history zset, 4 its due zset, 5 its busy zset,
--   6 lost zset, 7 bucket due zset, 8 bucket held zset, 9 bucket open zset,
--   10 bucket task-id hash, 11 bucket due index (zset: name -> next due instant)
-- and the entry's name as ARGV[1]. Every change of a run's state goes through put_run(),
-- which keeps the run's record and all its indexes in one place.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fmt(n) return string.format('%d', n) end

-- Whether ``key`` holds a value of ``kind`` (or nothing): a key of another kind under our
-- prefix is a bad record, to be skipped or replaced, never a reason to fail the call.
local function key_is(key, kind)
  return redis.call('EXISTS', key) == 0 or redis.call('TYPE', key).ok == kind
end

local function entry_keys(keys, name)
  return {entry = keys[1], runs = keys[2], history = keys[3], due_e = keys[4],
          busy_e = keys[5], lost = keys[6], due = keys[7], held = keys[8], open = keys[9],
          tasks = keys[10], next = keys[11], name = name}
end

-- The same script for each of many entries in one call (claim.lua, sent.lua): one reply
-- for the client to read, not one per entry, and few arguments for it to frame. ``keys``:
-- each entry's eleven keys, entry after entry; ``argv``: ``shared`` arguments the same for
-- every entry, then two for each entry: its name, and its own arguments packed in one
-- string whose first byte separates them (the client picks a byte none of them holds; the
-- text after the last separator is the last argument). ``one(KEYS, ARGV)`` is the script
-- for one entry: its ARGV the name, the shared arguments, then the entry's own. Returns the
-- replies in order; an entry whose script raised an error (a record of a wrong type) has
-- '!' and the error's text instead: its writes are left as far as they got, as a call of
-- its own would leave them, and the entries after it go on.
local function each_entry(keys, argv, shared, one)
  local replies, k = {}, 0
  for a = shared + 1, #argv, 2 do
    local one_keys, one_argv = {}, {argv[a]}
    for i = 1, 11 do one_keys[i] = keys[k + i] end
    for i = 1, shared do one_argv[i + 1] = argv[i] end
    local packed, n = argv[a + 1], shared + 1
    local sep, at = string.sub(packed, 1, 1), 2
    while true do
      local found = string.find(packed, sep, at, true)
      n = n + 1
      one_argv[n] = string.sub(packed, at, (found or 0) - 1)
      if not found then break end
      at = found + 1
    end
    local ok, reply = pcall(one, one_keys, one_argv)
    if not ok then
      if type(reply) == 'table' then reply = reply.err end
      reply = '!' .. (string.gsub(tostring(reply), '\n', ' '))
    end
    replies[#replies + 1] = reply
    k = k + 11
  end
  return replies
end

-- The entry's next due instant in the due index (the entry's next_due field and its
-- bucket's zset, written together): a whole number of ms >= 0, or -1 (NOT_DUE: out of
-- the zset; the field says it was computed). '' leaves both as they are.
local function set_next(K, value)
  if value == '' then return end
  redis.call('HSET', K.entry, 'next_due', value)
  if tonumber(value) < 0 then
    redis.call('ZREM', K.next, K.name)
  else
    redis.call('ZADD', K.next, value, K.name)
  end
end

-- Whether the entry's definition version is ``expected`` ('' : not checked).
local function version_is(K, expected)
  return expected == '' or (redis.call('HGET', K.entry, 'version') or '0') == expected
end

local NUMBER_FIELDS = {due = true, token = true, claimed_at = true, sending_at = true,
  sent_at = true, started_at = true, finished_at = true, released_at = true,
  revived_at = true, worker_pid = true, retries = true, attempts = true, reclaims = true,
  deliveries = true}

-- A run's record: nil when there is none, false when it cannot be read (bad JSON, an
-- unknown state, a number field that is not a number). A bad record is never trusted.
local function get_run(K, due)
  local raw = redis.call('HGET', K.runs, due)
  if not raw then return nil end
  local ok, run = pcall(cjson.decode, raw)
  if not ok or type(run) ~= 'table' or not STATE[run.state] then return false end
  for f, v in pairs(run) do  -- (the fields the record has: fewer than NUMBER_FIELDS)
    if NUMBER_FIELDS[f] and type(v) ~= 'number' then return false end
  end
  if type(run.due) ~= 'number' or fmt(run.due) ~= due then return false end
  if run.owner ~= nil and type(run.owner) ~= 'string' then return false end
  return run
end

-- The entry's pause as read by HMGET of paused_at, last_paused_at and resumed_at (see
-- pause_of).
local function pause_from(paused_at, from, to)
  return {paused = paused_at ~= false, from = tonumber(from or ''), to = tonumber(to or '')}
end

-- The entry's anchor, checkpoint and token (and token_text, the token as written back);
-- nil and the field's name when one is bad. Its pause (as pause_of) comes in the same HMGET.
local function get_entry(K)
  local v = redis.call('HMGET', K.entry, 'anchor', 'checkpoint', 'token', 'paused_at',
                       'last_paused_at', 'resumed_at')
  local e = {}
  for i, f in ipairs({'anchor', 'checkpoint', 'token'}) do
    if v[i] then
      local n = tonumber(v[i])
      if n == nil or n ~= math.floor(n) or math.abs(n) == math.huge then return nil, f end
      e[f] = n
    end
  end
  e.token = e.token or 0
  if v[3] and fmt(e.token) ~= v[3] and math.abs(e.token) < 2^53 then
    -- a whole number written otherwise ('5.0', '0x10', by a tool or a restore): stored as
    -- the counter HINCRBY can count on from, and as the client reads it
    redis.call('HSET', K.entry, 'token', fmt(e.token))
  end
  e.token_text = v[3] and (math.abs(e.token) < 2^53 and fmt(e.token) or v[3])
  e.pause = pause_from(v[4], v[5], v[6])
  return e
end

-- Whether the store still holds a beat's newest write about a run (kept.lua; heartbeat.lua
-- on one server): '1' held, '0' lost, '' a record that cannot be read (not judged), 'r' a
-- write ``confirmed`` ('1': held at an earlier heartbeat of the caller's, whose continuity
-- is judged) of an entry the store no longer holds at all (its record, and the write's
-- run: a prune removes both), or holds made anew (an anchor other than ``anchor``, the
-- write's entry's: '' not known): removed since (a prune), not lost (see
-- Written.confirmed).
local function write_kept(K, due, token_text, kind, confirmed, anchor)
  local e = get_entry(K)
  if not e then return '' end
  local token = tonumber(token_text)
  if confirmed == '1' then
    if not e.anchor and redis.call('EXISTS', K.entry) == 0
        and redis.call('HEXISTS', K.runs, due) == 0 then
      return 'r'
    end
    if e.anchor and anchor and anchor ~= '' and e.anchor ~= tonumber(anchor) then
      return 'r'
    end
  end
  if not e.anchor or e.token < token then return '0' end
  local run = get_run(K, due)
  if run == false then return '' end
  if run == nil then return '1' end
  local mine = run.token or 0
  if mine == 0 then return '1' end
  if mine < token then return '0' end
  if mine == token and ((kind == WROTE.check and run.state == STATE.claimed)
      or (kind == WROTE.sent and (HELD[run.state] or run.state == STATE.due
                                  or run.state == STATE.waiting))) then
    return '0'
  end
  return '1'
end

local function held_member(K, run)
  return (run.owner or '') .. '|' .. fmt(run.token or 0) .. '|' .. fmt(run.due) .. '|' .. K.name
end

local function plain_member(K, run) return fmt(run.due) .. '|' .. K.name end

-- The instant a run last became what it is: what the sweeps compare with their cutoffs.
local function since(run)
  if run.state == STATE.due then return run.released_at or run.claimed_at or run.due end
  if run.state == STATE.waiting then return run.waiting_at or run.due end
  if HELD[run.state] then return run.sending_at or run.claimed_at or 0 end
  return run.revived_at or run.started_at or run.sent_at or run.sending_at or 0
end

-- Where a run is indexed, as up to two places (key, member, score), returned one after the
-- other (no table: put_run runs on every transition): the bucket's index of its kind,
-- and the entry's own index of runs due again (what a claim takes) or busy — being sent,
-- sent or started (what overlap="skip" waits for). A claimed run is only in the bucket's
-- held index; a final one in none. A waiting run (overlap="buffer_one") is in the entry's
-- index of due runs (a claim takes it once the entry is not busy); whether it is in the
-- bucket's (what the sweeps report due) depends on the entry, not on the run alone: see
-- place_waiting(). The two places of a run are in two keys.
local function places(K, run)
  local state = run.state
  if state == STATE.waiting then
    return K.due_e, fmt(run.due), run.due
  elseif state == STATE.due then
    return K.due_e, fmt(run.due), run.due, K.due, plain_member(K, run), since(run)
  elseif state == STATE.claimed then
    return K.held, held_member(K, run), since(run)
  elseif state == STATE.sending then
    return K.held, held_member(K, run), since(run), K.busy_e, fmt(run.due), run.due
  elseif OPEN[state] then
    return K.open, plain_member(K, run), since(run), K.busy_e, fmt(run.due), run.due
  end
end

-- Whether a run makes the entry's next runs overlap: being sent, sent or started. A run
-- registered again after a wipe as sent, that no worker has started since, may well be
-- finished: it does not.
local function overlaps(run)
  return (run.state == STATE.sending or OPEN[run.state] == true)
    and not (run.reseeded and run.state == STATE.sent)
end

-- Whether another run of the entry than ``due`` (nil: any) overlaps: what the overlap
-- policies wait for.
local function busy_besides(K, due)
  for _, other in ipairs(redis.call('ZRANGE', K.busy_e, 0, -1)) do
    if other ~= due then
      local o = get_run(K, other)
      if o and overlaps(o) then return true end
    end
  end
  return false
end

-- Whether an operator paused the entry: its scheduled runs are recorded skipped.
local function is_paused(K)
  return redis.call('HEXISTS', K.entry, 'paused_at') == 1
end

-- The entry's pause as the claim and the check apply it: whether it is paused, and its last
-- pause [from, to) (last_paused_at, resumed_at), whose instants stay skipped after it.
local function pause_of(K)
  local v = redis.call('HMGET', K.entry, 'paused_at', 'last_paused_at', 'resumed_at')
  return pause_from(v[1], v[2], v[3])
end

-- Whether a scheduled run due at ``due`` (a number) is skipped for the pause ``P``.
local function paused_for(P, due)
  return P.paused or (P.from ~= nil and P.to ~= nil and due >= P.from and due < P.to)
end

-- The entry's waiting runs are in the bucket's index of due runs (the sweeps report them)
-- only while a claim would take them: when no run of the entry overlaps, or when it is
-- paused (a claim records them skipped). Else a sweep would take them in vain, each time,
-- and they would use up its limit ahead of runs that are due. Called wherever that may
-- change: a run that starts or stops overlapping, a run that starts or stops waiting, a
-- pause or a resume.
local function place_waiting(K)
  if K.no_due then return end  -- the caller read the entry's due runs: none, none added
  local dues = redis.call('ZRANGE', K.due_e, 0, -1)
  if #dues == 0 then return end
  local waiting = {}
  for _, due in ipairs(dues) do
    local run = get_run(K, due)
    if run and run.state == STATE.waiting then waiting[#waiting + 1] = run end
  end
  if #waiting == 0 then return end
  local takeable = is_paused(K) or not busy_besides(K, nil)
  for _, run in ipairs(waiting) do
    if takeable then
      redis.call('ZADD', K.due, since(run), plain_member(K, run))
    else
      redis.call('ZREM', K.due, plain_member(K, run))
    end
  end
end

-- Index a run at (k, m, score) unless its old form, at places (o1, n1, t1) and (o2, n2, t2),
-- has it there with that score; which of the old places it is (1, 2; nil: neither).
local function put_place(k, m, score, o1, n1, t1, o2, n2, t2)
  if k == o1 and m == n1 then
    if score ~= t1 then redis.call('ZADD', k, score, m) end
    return 1
  elseif k == o2 and m == n2 then
    if score ~= t2 then redis.call('ZADD', k, score, m) end
    return 2
  end
  redis.call('ZADD', k, score, m)
  return nil
end

-- Store ``run`` (whose previous form was ``old``: nil for a new run) and its indexes,
-- touching only the places that change.
local function put_run(K, run, old)
  local k1, m1, s1, k2, m2, s2 = places(K, run)
  -- (every run that enters an entry's index of due runs enters it here: a caller that
  -- read it empty, K.no_due, learns it is not any more)
  if k1 == K.due_e then K.no_due = nil end
  local o1, n1, t1, o2, n2, t2
  if old then o1, n1, t1, o2, n2, t2 = places(K, old) end
  local kept1, kept2 = false, false
  if k1 then
    local i = put_place(k1, m1, s1, o1, n1, t1, o2, n2, t2)
    kept1, kept2 = i == 1, i == 2
  end
  if k2 then
    local i = put_place(k2, m2, s2, o1, n1, t1, o2, n2, t2)
    kept1, kept2 = kept1 or i == 1, kept2 or i == 2
  end
  -- the old form's places the run has left
  if o1 and not kept1 then redis.call('ZREM', o1, n1) end
  if o2 and not kept2 then redis.call('ZREM', o2, n2) end
  local was_waiting = old ~= nil and old.state == STATE.waiting
  if was_waiting and run.state ~= STATE.waiting and run.state ~= STATE.due then
    redis.call('ZREM', K.due, plain_member(K, run))  -- (place_waiting may have put it)
  end
  redis.call('HSET', K.runs, fmt(run.due), cjson.encode(run))
  if run.state == STATE.waiting or was_waiting
      or (old ~= nil and overlaps(old)) ~= overlaps(run) then
    place_waiting(K)
  end
end

-- Forget a run that cannot be read: out of every index of the entry (its record stays
-- for an operator to look at until the history trims it).
local function drop_bad(K, due)
  redis.call('ZREM', K.due_e, due)
  redis.call('ZREM', K.busy_e, due)
  for _, key in ipairs({K.due, K.open}) do redis.call('ZREM', key, due .. '|' .. K.name) end
  -- Held members carry owner and token: find them by their due and name.
  local suffix = '|' .. due .. '|' .. K.name
  for _, m in ipairs(redis.call('ZRANGE', K.held, 0, -1)) do
    if string.sub(m, -#suffix) == suffix then redis.call('ZREM', K.held, m) end
  end
end

local function shallow_copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- The guards every transition shares.

-- Whether a scheduled run of the entry newer than ``due`` is being sent, sent or started
-- (as busy_besides counts them): an occurrence older than it comes too late to run after it
-- (overlap="buffer_one" skips it). An operator's request is no occurrence of the schedule.
local function busy_newer(K, due)
  for _, other in ipairs(redis.call('ZRANGEBYSCORE', K.busy_e, '(' .. due, '+inf')) do
    local o = get_run(K, other)
    if o and not o.manual and overlaps(o) then return true end
  end
  return false
end

-- Record a run skipped for ``reason``.
local function skip_run(K, run, reason, now)
  local old = shallow_copy(run)
  run.state = STATE.skipped
  run.reason = reason
  run.finished_at = now
  put_run(K, run, old)
end

-- The check before publish of ``run``, held by the caller (``old``: its stored form; nil
-- for a run the same call claims, not stored yet): it is marked being sent with
-- ``task_id``, or recorded skipped (``reason``; else 'paused' for a scheduled run of a
-- paused entry or due in its last pause, or 'overlap' as the entry's ``overlap`` policy
-- says while another run of it is being sent, sent or started), or, with "buffer_one",
-- waiting until that run is final. Stored, and answered as check.lua answers. ``pause``:
-- the entry's (pause_of).
local function check_run(K, run, old, task_id, reason, overlap, pause, now)
  local due = fmt(run.due)
  if reason == '' and not run.manual and paused_for(pause, run.due) then
    reason = REASON.paused  -- paused, or due in its last pause
  end
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
  run.task_id = task_id
  run.sending_at = now
  put_run(K, run, old)
  return CHECK.send
end

-- Whether ``token`` (a string from ARGV; '' = any) is the run's current token.
local function has_token(run, token)
  return token == '' or fmt(run.token or 0) == token
end

-- Whether ``owner`` holds the run with ``token``: claimed by it, or being sent by it.
local function holds(run, owner, token)
  return HELD[run.state] and run.owner == owner and has_token(run, token)
end

-- Whether the run's holder has passed the check before publish (a message may exist, and
-- an outcome may follow): any state but claimed, due and waiting.
local function handed_over(run)
  return run.state ~= STATE.claimed and run.state ~= STATE.due
    and run.state ~= STATE.waiting
end

-- The run is due again, claimable by any beat that has the entry; its next claim gets a
-- fresh token, so whoever held it cannot pass the check before publish any more.
local function to_due(run, by, now)
  run.released_by = by
  run.owner = nil
  run.state = STATE.due
  run.released_at = now
end

-- A final run leaves the store: its record, and the task id it was started under.
local function forget_run(K, run)
  redis.call('HDEL', K.runs, fmt(run.due))
  if type(run.task_id) == 'string' then redis.call('HDEL', K.tasks, run.task_id) end
end


-- A fresh token, above the caller's floor (what it has seen: a store that went back must
-- not hand out a token again).
local function next_token(K, floor)
  local token = redis.call('HINCRBY', K.entry, 'token', 1)
  if floor and token <= floor then
    token = floor + 1
    redis.call('HSET', K.entry, 'token', fmt(token))
  end
  return token
end

-- The entry's history horizon: the newest instant whose run was trimmed out of the store
-- (what ran at or before it is no longer known). nil when nothing was trimmed, false when
-- the field cannot be read.
local function horizon_of(K)
  local raw = redis.call('HGET', K.entry, 'horizon')
  if not raw then return nil end
  local n = tonumber(raw)
  if n == nil or n ~= math.floor(n) or math.abs(n) == math.huge then return false end
  return n
end

-- A trim removed the run at ``due`` (a number): the horizon moves up to it. One that cannot
-- be read is written again at the later of ``due`` and ``now`` (no run after now was ever
-- trimmed): a backfill is refused more, never less.
local function raise_horizon(K, due, now)
  local h = horizon_of(K)
  if h == false then
    due = math.max(due, now)
  elseif h ~= nil and h >= due then
    return
  end
  redis.call('HSET', K.entry, 'horizon', fmt(due))
end

-- The later of ``a`` (nil: none) and the instant ``due`` (a number or its text; one that is
-- no number is left out).
local function newest(a, due)
  local d = tonumber(due)
  if d == nil or (a ~= nil and a >= d) then return a end
  return d
end

-- Keep the history to ``limit`` runs. The oldest final runs beyond it are dropped first,
-- wherever they are (a live run older than them does not keep them); a run presumed lost
-- moves to the lost zset (kept a week, at most ``limit`` of them) so that a late delivery
-- still finds its record; only when there are not enough final runs is the oldest run sent
-- and never started pushed out, presumed lost (history_limit). Runs being claimed, sent or
-- run are never dropped.
local function trim(K, limit, now)
  local gone = nil  -- the newest instant whose run leaves the store: the horizon
  local excess = redis.call('ZCARD', K.history) - limit
  if excess > 0 then
    local unstarted = {}
    -- The oldest runs, and a bounded look past live ones (a claim must stay cheap).
    for _, due in ipairs(redis.call('ZRANGE', K.history, 0, excess + 63)) do
      if excess <= 0 then break end
      local run = get_run(K, due)
      if not run then
        if run == false then drop_bad(K, due) end
        redis.call('HDEL', K.runs, due)
        redis.call('ZREM', K.history, due)
        excess = excess - 1
        gone = newest(gone, due)
      elseif run.state == STATE.lost then
        redis.call('ZREM', K.history, due)
        redis.call('ZADD', K.lost, run.finished_at or now, due)
        excess = excess - 1
      elseif FINAL[run.state] then
        forget_run(K, run)
        redis.call('ZREM', K.history, due)
        excess = excess - 1
        gone = newest(gone, run.due)
      elseif run.state == STATE.sent and not run.started_at then
        unstarted[#unstarted + 1] = run
      end
    end
    for i = 1, math.min(excess, #unstarted) do
      local run = unstarted[i]
      local old = shallow_copy(run)
      run.state = STATE.lost
      run.reason = REASON.history_limit
      run.finished_at = now
      put_run(K, run, old)
      redis.call('ZREM', K.history, fmt(run.due))
      redis.call('ZADD', K.lost, now, fmt(run.due))
    end
  end
  if gone then raise_horizon(K, gone, now) end
  if redis.call('EXISTS', K.lost) == 0 then return end
  local expired = redis.call('ZRANGEBYSCORE', K.lost, '-inf', '(' .. fmt(now - LOST_KEEP_MS))
  local over = redis.call('ZCARD', K.lost) - #expired - limit
  if over > 0 then
    for _, due in ipairs(redis.call('ZRANGE', K.lost, #expired, #expired + over - 1)) do
      expired[#expired + 1] = due
    end
  end
  gone = nil
  for _, due in ipairs(expired) do
    local run = get_run(K, due)
    if not run then
      redis.call('HDEL', K.runs, due)
      gone = newest(gone, due)
    elseif run.state == STATE.lost then
      forget_run(K, run)
      gone = newest(gone, run.due)
    end
    redis.call('ZREM', K.lost, due)
  end
  if gone then raise_horizon(K, gone, now) end
end

-- A set of the owner ids in ``text`` (a JSON list); nil when ``text`` is not one (not
-- known: every owner counts as alive).
local function id_set(text)
  local ok, ids = pcall(cjson.decode, text)
  if not ok or type(ids) ~= 'table' then return nil end
  local set = {}
  for _, id in ipairs(ids) do set[id] = true end
  return set
end

-- The beats that registered the entry (owner id -> when, on the clock the callers read the
-- live beats by): nil when none was ever recorded (registered before registrants were
-- kept), false when the field cannot be read (not a JSON object of numbers).
local function registrants_of(K)
  local raw = redis.call('HGET', K.entry, 'registrants')
  if not raw then return nil end
  local ok, r = pcall(cjson.decode, raw)
  if not ok or type(r) ~= 'table' then return false end
  for id, at in pairs(r) do
    if type(id) ~= 'string' or type(at) ~= 'number' then return false end
  end
  return r
end

-- Whether a registrant counts as alive: among the caller's ``live`` owners (a set; nil: not
-- known, all are), or registered at or after ``since`` (when the caller read them: it may
-- have started since).
local function registrant_alive(live, since, id, at)
  return live == nil or live[id] == true or at >= since
end

-- Whether a live beat registered the entry (registrant_alive; ``live_ids`` a JSON list,
-- read at ``since``); also when its registrants cannot be read: nothing is removed that
-- cannot be seen.
local function registered_alive(K, live_ids, since)
  local r = registrants_of(K)
  if r == false then return true end
  if r == nil then return false end
  local live = id_set(live_ids)
  for id, at in pairs(r) do
    if registrant_alive(live, since, id, at) then return true end
  end
  return false
end

-- A backfill's refusal when any of its instants (ARGV[first] on) has no run recorded and is
-- at or before the entry's history horizon (or the horizon cannot be read): whether it ran
-- is not known. {-2, how many, the horizon or ''}; nil when none is. (An instant the store
-- still has a record of is known: that record is its latest run.)
local function beyond_horizon(K, argv, first)
  local h = horizon_of(K)
  if h == nil then return nil end
  local n = 0
  for i = first, #argv do
    if (h == false or tonumber(argv[i]) <= h)
        and redis.call('HEXISTS', K.runs, argv[i]) == 0 then
      n = n + 1
    end
  end
  if n == 0 then return nil end
  return {-2, n, h and fmt(h) or ''}
end

-- Record a new run at ``due`` (a number) skipped for ``reason``, in the history: a claim's
-- planned skips, and those of a definition's change.
local function put_skipped(K, due, reason, now)
  put_run(K, {due = due, state = STATE.skipped, reason = reason, finished_at = now}, nil)
  redis.call('ZADD', K.history, due, fmt(due))
end

-- Definition scripts get the entry's keys (entry_keys), then its bucket's change log (zset:
-- name -> sequence number), its names that have or had a definition (zset, all scores 0:
-- in name order), its tombstones still in the log (zset: name -> deleted at) and its
-- sequence hash (seq: the last number handed out; dropped: the newest number of a member
-- that left the log).
local function definition_keys(keys, name)
  local K = entry_keys(keys, name)
  K.log, K.named, K.gone, K.seq = keys[12], keys[13], keys[14], keys[15]
  return K
end

-- The entry's definition: its version (0: it never had one), whether it has one now (live:
-- not a tombstone) and its last change id; nil and the field's name when the version
-- cannot be read (not a whole number >= 1, or missing beside a definition).
local function definition_of(K)
  local v = redis.call('HMGET', K.entry, 'version', 'definition', 'change_id')
  local version = 0
  if v[1] then
    version = tonumber(v[1])
    if version == nil or version ~= math.floor(version) or version < 1 or version >= 2^53 then
      return nil, 'version'
    end
  elseif v[2] then
    return nil, 'version'
  end
  return {version = version, live = v[2] ~= false, change_id = v[3] or ''}
end

-- The next sequence number of the entry's bucket's change log: above the last one (and the
-- newest member: a counter that cannot be read), and at least the clock times
-- CHANGES_PER_MS (a copy put back numbers on above what it numbered before). A dropped mark
-- that cannot be read is set to the head (readers reload once, nothing is missed).
local function next_seq(K, now)
  local v = redis.call('HMGET', K.seq, 'seq', 'dropped')
  local top = redis.call('ZRANGE', K.log, -1, -1, 'WITHSCORES')
  local head = math.max(tonumber(v[1] or '0') or 0, tonumber(top[2] or '0'))
  if v[2] and not tonumber(v[2]) then redis.call('HSET', K.seq, 'dropped', fmt(head)) end
  local seq = math.max(head + 1, now * CHANGES_PER_MS)
  redis.call('HSET', K.seq, 'seq', fmt(seq))
  return seq
end

-- The entry ``name`` leaves its bucket's change log (a tombstone kept its time, a prune):
-- the dropped mark rises to its number, so that a reader that had not read it reloads.
local function unlog(K, name)
  local seq = tonumber(redis.call('ZSCORE', K.log, name) or '')
  if seq then
    local dropped = tonumber(redis.call('HGET', K.seq, 'dropped') or '')
    if dropped == nil or seq > dropped then
      redis.call('HSET', K.seq, 'dropped', fmt(seq))
    end
    redis.call('ZREM', K.log, name)
  end
  redis.call('ZREM', K.gone, name)
end

-- Tombstones deleted before ``before`` leave the change log, TOMBSTONES_DROPPED at most.
local function drop_tombstones(K, before)
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', K.gone, '-inf', '(' .. fmt(before),
                                   'LIMIT', 0, TOMBSTONES_DROPPED)) do
    unlog(K, name)
  end
end
