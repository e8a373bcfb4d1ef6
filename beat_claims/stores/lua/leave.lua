-- A beat stopped: its heartbeat lapses now, so its claims are taken back at once.
-- KEYS: alive zset. ARGV: owner id.
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], now_ms() - 1, ARGV[1])
end
return 1
