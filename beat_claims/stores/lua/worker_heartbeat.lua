-- A worker process is alive for ttl more: its record says who it is, when it was renewed
-- and when it lapses (the store's clock). The server removes it keep ms after it lapses
-- (the key's expiry): the records are those of the processes of the last minutes. A key
-- of another kind, or a record that cannot be read, is replaced.
-- KEYS: the process's key ({P}:w:ID, in the slot of the store's global keys). ARGV: node
-- name, pid, process identity, ttl ms, keep ms.
-- Returns the record as written (one JSON string).
local now = now_ms()
local ttl = tonumber(ARGV[4])
if not key_is(KEYS[1], 'string') then redis.call('DEL', KEYS[1]) end
local record = cjson.encode({worker = ARGV[1], pid = tonumber(ARGV[2]), process = ARGV[3],
                             renewed_at = now, expires_at = now + ttl})
redis.call('SET', KEYS[1], record, 'PX', ttl + tonumber(ARGV[5]))
return record
