-- One step of a rebuild pass over the registry of every entry (KEYS[1]: {P}:entries,
-- digest -> name): HSCAN from cursor ARGV[1], COUNT ARGV[2]. The entries' hash keys are
-- made here from their digests, as the client makes them (ARGV[3]: the key prefix P,
-- ARGV[4]: the number of buckets), so that the client reads one string a bucket rather
-- than two replies an entry. Returns {the next cursor, then for each bucket (0 first) the
-- keys of the entries it named, '\n'-separated ('' : none)}. A field that is not a digest
-- names a key no entry has (looked at, found nothing) or, not hexadecimal, is left out.
local reply = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local buckets = tonumber(ARGV[4])
local found, keys, heads = reply[2], {}, {}
for b = 0, buckets - 1 do
  keys[b] = {}
  heads[b] = string.format('{%s:%02d}:e:', ARGV[3], b)
end
local sub, number = string.sub, tonumber
for i = 1, #found, 2 do
  local d = found[i]
  local head = number(sub(d, 1, 4), 16)
  if head then
    local b = head % buckets
    local into = keys[b]
    into[#into + 1] = heads[b] .. d
  end
end
local out = {reply[1]}
for b = 0, buckets - 1 do out[b + 2] = table.concat(keys[b], '\n') end
return out
