-- Claim (or record as skipped) the next occurrences of one entry, and take any occurrence
-- a stopped beat released. One compare-and-set: the caller computed the occurrences from
-- the anchor and checkpoint it believes in; if the store holds others, nothing is written.
-- The checkpoint only moves forward.
-- KEYS: entry, runs, history, live, open
-- ARGV: owner, expected anchor, expected checkpoint ('' none, '*' do not check),
--       history limit, overlap policy, n, then n pairs (due, 'claim' | skip reason)
local entry, runs, history, live, open = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner = ARGV[1]
local anchor = redis.call('HGET', entry, 'anchor')
local checkpoint = redis.call('HGET', entry, 'checkpoint')
if ARGV[3] ~= '*' and ((anchor or '') ~= ARGV[2] or (checkpoint or '') ~= ARGV[3]) then
  return {'conflict', anchor or '', checkpoint or ''}
end
local now = now_ms()
local limit = tonumber(ARGV[4])
local busy = false
if ARGV[5] == 'skip' then
  busy = redis.call('ZCARD', open) > 0
  if not busy then
    for _, due in ipairs(redis.call('ZRANGE', live, 0, -1)) do
      local run = get_run(runs, due)
      if run and (run.state == 'claimed' or run.state == 'sending') then busy = true end
    end
  end
end
local claimed, skipped, taken = {}, {}, {}
local cp = tonumber(checkpoint or '-1')
local n = tonumber(ARGV[6])
for i = 1, n do
  local due = ARGV[5 + 2 * i]
  local action = ARGV[6 + 2 * i]
  local due_n = tonumber(due)
  if due_n > cp then
    if action == 'claim' and busy then action = 'overlap' end
    local run
    if action == 'claim' then
      local token = redis.call('HINCRBY', entry, 'token', 1)
      run = {due = due_n, state = 'claimed', token = token, owner = owner, claimed_at = now}
      redis.call('ZADD', live, due_n, due)
      claimed[#claimed + 1] = due
      claimed[#claimed + 1] = token
      if ARGV[5] == 'skip' then busy = true end
    else
      run = {due = due_n, state = 'skipped', reason = action, finished_at = now}
      skipped[#skipped + 1] = due
      skipped[#skipped + 1] = action
    end
    put_run(runs, due, run)
    redis.call('ZADD', history, due_n, due)
    cp = due_n
  end
end
if n > 0 then redis.call('HSET', entry, 'checkpoint', string.format('%d', cp)) end
-- Released occurrences stay due until someone claims them: this call does.
for _, due in ipairs(redis.call('ZRANGE', live, 0, -1)) do
  local run = get_run(runs, due)
  if run and run.state == 'due' then
    local token = redis.call('HINCRBY', entry, 'token', 1)
    run.state = 'claimed'
    run.token = token
    run.owner = owner
    run.claimed_at = now
    put_run(runs, due, run)
    taken[#taken + 1] = due
    taken[#taken + 1] = token
  elseif not run then
    redis.call('ZREM', live, due)  -- a missing or corrupt record cannot be claimed
  end
end
-- Keep the history bounded; runs that are not final are never dropped, and a run presumed
-- lost is kept a week (its delivery may still turn up and must find its record).
local excess = redis.call('ZCARD', history) - limit
if excess > 0 then
  for _, due in ipairs(redis.call('ZRANGE', history, 0, excess - 1)) do
    local run = get_run(runs, due)
    if run == nil or run == false or (FINAL[run.state] and (run.state ~= 'lost'
        or now - (run.finished_at or 0) > 604800000)) then
      redis.call('HDEL', runs, due)
      redis.call('ZREM', history, due)
    end
  end
end
return {'ok', claimed, skipped, taken}
