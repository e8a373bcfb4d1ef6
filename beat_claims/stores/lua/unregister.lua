-- A beat no longer schedules the entry (a row disabled or deleted while it runs): it is no
-- longer one of its registrants. KEYS: the entry's keys. ARGV: name, owner id.
-- Returns 1 if it was one.
local K = entry_keys(KEYS, ARGV[1])
local r = registrants_of(K)
if not r or r[ARGV[2]] == nil then return 0 end
r[ARGV[2]] = nil
redis.call('HSET', K.entry, 'registrants', cjson.encode(r))
return 1
