-- An operator removes an entry no schedule has any more, with every record of its runs.
-- An entry with a run claimed, being sent, sent or started is kept (it may still be sent,
-- or report), and so is one a live beat registered (registered_alive), and one with a
-- live definition (a tombstone goes with the entry, and leaves its bucket's change log).
-- KEYS: the entry's definition keys. ARGV: name, the live owner ids (a JSON list), the
-- instant they were read. Returns 1 if removed.
local K = definition_keys(KEYS, ARGV[1])
if redis.call('EXISTS', K.entry) == 0 then return 0 end
if redis.call('HEXISTS', K.entry, 'definition') == 1 then return 0 end
if registered_alive(K, ARGV[2], tonumber(ARGV[3])) then return 0 end
if redis.call('ZCARD', K.busy_e) > 0 then return 0 end
local suffix = '|' .. K.name
for _, m in ipairs(redis.call('ZRANGE', K.held, 0, -1)) do
  if string.sub(m, -#suffix) == suffix then return 0 end
end
for _, due in ipairs(redis.call('ZRANGE', K.due_e, 0, -1)) do
  redis.call('ZREM', K.due, due .. suffix)
end
for _, raw in ipairs(redis.call('HVALS', K.runs)) do
  local ok, run = pcall(cjson.decode, raw)
  if ok and type(run) == 'table' and type(run.task_id) == 'string' then
    redis.call('HDEL', K.tasks, run.task_id)
  end
end
unlog(K, ARGV[1])
redis.call('ZREM', K.named, ARGV[1])
redis.call('ZREM', K.next, ARGV[1])
redis.call('DEL', K.entry, K.runs, K.history, K.due_e, K.busy_e, K.lost)
return 1
