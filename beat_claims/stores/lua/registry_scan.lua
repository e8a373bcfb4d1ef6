-- One step of a rebuild pass over the registry of every entry (KEYS[1]: {P}:entries,
-- digest -> name): HSCAN from cursor ARGV[1], COUNT ARGV[2]. The entries' hash keys are
-- made here from their digests, as the client makes them (ARGV[3]: the key prefix P,
-- ARGV[4]: the number of buckets), so that the client reads one string a bucket rather
-- than two replies an entry. Returns {the next cursor, then for each bucket (0 first) the
-- keys of the entries it named, '\n'-separated ('' : none)}. A field that is not a digest
-- (ARGV[5] lowercase hexadecimal digits) names no entry, and is left out: every key
-- answered has the same length.
local reply = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local buckets, size = tonumber(ARGV[4]), tonumber(ARGV[5])
local found, keys, heads = reply[2], {}, {}
for b = 0, buckets - 1 do
  keys[b] = {}
  heads[b] = string.format('{%s:%02d}:e:', ARGV[3], b)
end
local sub, number, find = string.sub, tonumber, string.find
for i = 1, #found, 2 do
  local d = found[i]
  if #d == size and not find(d, '[^0-9a-f]') then
    local head = number(sub(d, 1, 4), 16)
    local b = head % buckets
    local into = keys[b]
    into[#into + 1] = heads[b] .. d
  end
end
local out = {reply[1]}
for b = 0, buckets - 1 do out[b + 2] = table.concat(keys[b], '\n') end
return out
