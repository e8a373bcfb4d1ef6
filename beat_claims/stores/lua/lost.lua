-- Runs sent (or started) before the cutoff with no outcome become 'lost'.
-- KEYS: runs, open. ARGV: cutoff ms. Returns the dues marked lost.
local out = {}
local cutoff = tonumber(ARGV[1])
local now = now_ms()
for _, due in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  local run = get_run(KEYS[1], due)
  if not run or FINAL[run.state] then
    redis.call('ZREM', KEYS[2], due)
  elseif (run.revived_at or run.sent_at or run.sending_at or now) <= cutoff then
    run.state = 'lost'
    run.finished_at = now
    put_run(KEYS[1], due, run)
    redis.call('ZREM', KEYS[2], due)
    out[#out + 1] = due
  end
end
return out
