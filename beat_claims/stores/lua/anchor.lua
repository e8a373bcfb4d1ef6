-- Make sure an entry has an anchor: the first beat to see the entry sets it.
-- KEYS: entry hash. ARGV: name, description, anchor to use if none (the store's clock, read
-- once for a batch, so entries first seen together fall due together).
-- Returns {anchor, checkpoint or ''}.
local anchor = redis.call('HGET', KEYS[1], 'anchor')
if not anchor then
  anchor = ARGV[3]
  redis.call('HSET', KEYS[1], 'anchor', anchor)
end
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'schedule', ARGV[2])
return {anchor, redis.call('HGET', KEYS[1], 'checkpoint') or ''}
