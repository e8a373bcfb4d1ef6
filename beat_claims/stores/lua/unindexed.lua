-- Which of these entries have a record without a next_due (what a rebuild sweep indexes),
-- read for many in one call (one bucket per call on a cluster; any on one server), until
-- ARGV[1] of them are found: the keys after the last found are not read (the next page
-- starts there). KEYS: the entries' hashes. Returns {the number of keys read, the
-- positions (from 1) of those with an anchor and no next_due, ','-separated ('' :
-- none)}; a key that is gone, not a hash, or indexed is left out (a record that cannot
-- be read is not the rebuild's to repair).
local out, most, read = {}, tonumber(ARGV[1]), 0
for i, key in ipairs(KEYS) do
  if #out >= most then break end
  read = i
  local v = redis.pcall('HMGET', key, 'anchor', 'next_due')
  if not v.err and v[1] and not v[2] then out[#out + 1] = i end
end
return {read, table.concat(out, ',')}
