-- The instant new entries are anchored at. Beats that start together (within the key's
-- lifetime) get the same one, so entries they first see together fall due together even
-- when their registrations interleave on the server.
-- KEYS: the anchoring key. ARGV: lifetime ms. Returns the instant (store clock, ms).
if not key_is(KEYS[1], 'string') then redis.call('DEL', KEYS[1]) end
local instant = redis.call('GET', KEYS[1])
if instant then return instant end
instant = fmt(now_ms())
redis.call('SET', KEYS[1], instant, 'PX', ARGV[1])
return instant
