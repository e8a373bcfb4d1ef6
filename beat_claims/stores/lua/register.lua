-- Register an entry: anchor it if new (the first beat wins), and merge in what the caller
-- knows of it after a wipe or a rollback: its anchor (only where the store has none), a
-- checkpoint and a token floor (the higher of the store's and the caller's is kept: nothing
-- goes back), and runs the caller knows of (restored only where the store has no record at
-- their instant, or where the store still holds a run the caller has since sent as claimed
-- or due, or, with a lower token, one that ended without running: a backfill replaced it);
-- the token counter is raised to every token of those runs. A field that cannot
-- be read is replaced, and named in the reply; a token counter replaced so starts above
-- every token the entry's runs hold.
-- KEYS: the entry's keys. ARGV: name, description, anchor for a new entry, known anchor
-- ('' none), checkpoint floor ('' none), token floor, history limit, known runs (JSON list
-- or ''). Returns {anchor, checkpoint or '', token, repaired fields (comma separated)}.
local K = entry_keys(KEYS, ARGV[1])
local repaired = {}
local e, bad = get_entry(K)
while not e do
  repaired[#repaired + 1] = bad
  redis.call('HDEL', K.entry, bad)
  e, bad = get_entry(K)
end
if not e.anchor then
  e.anchor = tonumber(ARGV[4] ~= '' and ARGV[4] or ARGV[3])
  redis.call('HSET', K.entry, 'anchor', fmt(e.anchor))
  set_next(K, '0')  -- (a new entry is due at once: its reader computes when it is due)
end
local floor = tonumber(ARGV[5])
if floor and (e.checkpoint == nil or e.checkpoint < floor) then
  e.checkpoint = floor
  redis.call('HSET', K.entry, 'checkpoint', fmt(floor))
end
local token_floor = tonumber(ARGV[6])
local known = ARGV[8] ~= '' and cjson.decode(ARGV[8]) or {}
-- Every token of the runs the caller knows was handed out: none may be handed out again,
-- whether its run is restored or the store has another record at its instant.
for _, run in ipairs(known) do
  if type(run.token) == 'number' and run.token > token_floor then
    token_floor = run.token
  end
end
for _, field in ipairs(repaired) do
  if field == 'token' then
    -- The counter could not be read: no token its runs hold may be handed out again.
    for _, raw in ipairs(redis.call('HVALS', K.runs)) do
      local ok, run = pcall(cjson.decode, raw)
      if ok and type(run) == 'table' and type(run.token) == 'number'
          and run.token > token_floor then
        token_floor = run.token
      end
    end
  end
end
if token_floor > e.token then
  e.token = token_floor
  redis.call('HSET', K.entry, 'token', fmt(token_floor))
end
redis.call('HSET', K.entry, 'name', ARGV[1], 'schedule', ARGV[2])
if #known > 0 then
  for _, run in ipairs(known) do
    local due = fmt(run.due)
    local stored = get_run(K, due)
    if stored == nil then
      put_run(K, run, nil)
      redis.call('ZADD', K.history, run.due, due)
    elseif stored and run.state == STATE.sent and not FINAL[stored.state]
        and not OPEN[stored.state] and (stored.token or 0) <= (run.token or 0)
        and ((stored.token or 0) > 0 or run.manual) then
      -- An older copy of the store still holds it claimed (or due again), and the caller
      -- sent it since: what the caller knows is newer. (Not over a run never claimed that
      -- the caller did not send as an operator's: a backfill or a request made since.)
      put_run(K, run, stored)
    elseif stored and run.state == STATE.sent and (stored.token or 0) < (run.token or 0)
        and (stored.state == STATE.skipped or stored.state == STATE.cancelled
             or ((stored.state == STATE.lost or stored.state == STATE.sent)
                 and not stored.started_at)) then
      -- An older copy of the store holds the run a backfill replaced (it ended without
      -- running, or an earlier send of the instant no worker started), and the caller sent
      -- a later run since, with a later token: the record of an instant always carries its
      -- latest token, so this copy is behind. As a backfill does, the old record goes with
      -- its task id.
      forget_run(K, stored)
      redis.call('ZREM', K.lost, due)
      put_run(K, run, nil)
      redis.call('ZADD', K.history, run.due, due)
    end
  end
  trim(K, tonumber(ARGV[7]), now_ms())
end
return {fmt(e.anchor), e.checkpoint and fmt(e.checkpoint) or '', fmt(e.token),
        table.concat(repaired, ',')}
