-- Which beats are alive (their heartbeat has not lapsed), and when that was read: what an
-- entry's registrants are judged by (a registration and a prune name the entry's keys, in
-- another hash slot: the caller reads these first, and passes them on).
-- KEYS: alive zset. Returns {now, {owner ids}, 1}; {now, {}, 0} when the key is not a
-- sorted set (not known: a registration then drops nobody, a prune removes nothing).
local now = now_ms()
if not key_is(KEYS[1], 'zset') then return {fmt(now), {}, 0} end
return {fmt(now), redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now), '+inf'), 1}
