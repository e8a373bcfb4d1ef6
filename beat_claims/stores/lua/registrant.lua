-- A beat that schedules the entry registered it: it becomes one of the entry's registrants,
-- at the instant the caller read the live beats; the registrants that are not alive then
-- (see registrant_alive) are dropped, so the list stays bounded by the live beats. A field
-- that cannot be read is replaced.
-- KEYS: the entry's keys. ARGV: name, owner id, that instant, the live owner ids (a JSON
-- list; anything else: not known, nobody is dropped). Returns 1, or 0 for no such entry.
local K = entry_keys(KEYS, ARGV[1])
if redis.call('EXISTS', K.entry) == 0 then return 0 end
local at = tonumber(ARGV[3])
local live = id_set(ARGV[4])
local kept = {}
local old = registrants_of(K)
if old then
  for id, since in pairs(old) do
    if registrant_alive(live, at, id, since) then kept[id] = since end
  end
end
kept[ARGV[2]] = at
redis.call('HSET', K.entry, 'registrants', cjson.encode(kept))
return 1
