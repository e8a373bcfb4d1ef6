-- A beat picked up the released runs of these entries: drop their notices, unless a
-- release came in since the beat read them (then the count moved and the notice stays).
-- KEYS: the notices hash. ARGV: entry, count seen, ...
local dropped = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    dropped = dropped + 1
  end
end
return dropped
