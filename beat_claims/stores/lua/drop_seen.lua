-- Drop fields of a notices hash (released-in, open-in) that a beat has dealt with, unless
-- their count moved since the beat read them (a newer notice then stays).
-- KEYS: the notices hash. ARGV: field, count seen, ...
local dropped = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    dropped = dropped + 1
  end
end
return dropped
