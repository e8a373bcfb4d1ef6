-- Take over the claims an owner holds in one entry, with fresh tokens: at once when the
-- owner is known dead (ARGV cutoff ''), otherwise only claims made (or, once checked,
-- checked) before the cutoff.
-- The old owner's token is superseded, so its check before publish refuses it.
-- KEYS: entry, runs, live. ARGV: old owner, new owner, cutoff ms or ''.
-- Returns a flat list: due, token, 1 if the old owner may already have published, ...
local out = {}
local now = now_ms()
local cutoff = tonumber(ARGV[3])
for _, due in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  local run = get_run(KEYS[2], due)
  if run and run.owner == ARGV[1] and (run.state == 'claimed' or run.state == 'sending')
      and (cutoff == nil or (run.sending_at or run.claimed_at or 0) <= cutoff) then
    local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
    local was_sending = run.state == 'sending' and 1 or 0
    run.reclaimed_from = run.owner
    run.reclaims = (run.reclaims or 0) + 1
    run.owner = ARGV[2]
    run.state = 'claimed'
    run.token = token
    run.claimed_at = now
    put_run(KEYS[2], due, run)
    out[#out + 1] = due
    out[#out + 1] = token
    out[#out + 1] = was_sending
  end
end
return out
