-- Shared by every beat-claims script (prepended by stores/redis.py).
-- Runs are JSON records in the entry's runs hash, keyed by their due instant (UTC ms).
-- Every timestamp is the store's own clock, so beats with skewed clocks agree.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function get_run(runs_key, due)
  local raw = redis.call('HGET', runs_key, due)
  if not raw then return nil end
  local ok, run = pcall(cjson.decode, raw)
  if not ok or type(run) ~= 'table' then return false end
  return run
end
local function put_run(runs_key, due, run)
  redis.call('HSET', runs_key, due, cjson.encode(run))
end
local FINAL = {done = true, failed = true, cancelled = true, skipped = true, lost = true}
