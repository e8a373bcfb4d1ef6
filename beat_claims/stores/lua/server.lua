-- The run id of the server that holds KEYS[1]'s slot. On a cluster the heartbeat asks the
-- master of every bucket and of the global keys (routed by key, so the cluster answers,
-- not a slot table the client read earlier): the epoch changes when any one of them is
-- another process. KEYS: one key of the slot (not touched). Returns the run id.
return string.match(redis.call('INFO', 'server'), 'run_id:(%w+)') or ''
