-- Whether entries have a record without a next_due (what a rebuild sweep indexes), read
-- for many in one call (KEYS and ARGV as each_entry takes them: the entry's keys; its
-- name): '1' for an entry with an anchor and no next_due, '0' for any other (gone, not
-- an entry, or indexed), '\n'-separated, in order.
local function unindexed_one(KEYS, ARGV)
  local v = redis.call('HMGET', KEYS[1], 'anchor', 'next_due')
  if v[1] and not v[2] then return '1' end
  return '0'
end

return table.concat(each_entry(KEYS, ARGV, unindexed_one), '\n')
