-- One step of a rebuild pass over the registry of every entry (KEYS[1]: {P}:entries,
-- digest -> name): HSCAN from cursor ARGV[1], COUNT ARGV[2]. The entries' hash keys are
-- made here from their digests, as the client makes them (ARGV[3]: the key prefix P,
-- ARGV[4]: the number of buckets), so that the client reads one string a bucket rather
-- than two replies an entry. Returns {the next cursor, then for each bucket (0 first) the
-- keys of the entries it named, '\n'-separated ('' : none)}; a field that is not a
-- digest (lowercase hex) names no entry and is left out.
local reply = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local prefix, buckets = ARGV[3], tonumber(ARGV[4])
local found, keys = reply[2], {}
for b = 1, buckets do keys[b] = {} end
for i = 1, #found, 2 do
  local d = found[i]
  if #d >= 4 and not string.find(d, '[^0-9a-f]') then
    local b = tonumber(string.sub(d, 1, 4), 16) % buckets
    local into = keys[b + 1]
    into[#into + 1] = string.format('{%s:%02d}:e:%s', prefix, b, d)
  end
end
local out = {reply[1]}
for b = 1, buckets do out[b + 1] = table.concat(keys[b], '\n') end
return out
