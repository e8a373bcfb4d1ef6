-- The state of entries a due index answered, and their definition version, read in one
-- call (one bucket per call on a cluster; all of them on one server).
-- KEYS: the entries' hashes. Returns, as one JSON string, per key [anchor, checkpoint,
-- token, version] as stored (false: absent).
local out = {}
for i, key in ipairs(KEYS) do
  if key_is(key, 'hash') then
    out[i] = redis.call('HMGET', key, 'anchor', 'checkpoint', 'token', 'version')
  else
    out[i] = {false, false, false, false}
  end
end
return cjson.encode(out)
