-- Whether the store still holds what a beat last wrote about a run: its claim (the entry's
-- token counter at or above its token, and a run at the instant, if any, with that token or
-- a later one), its check before publish (nor that run still claimed with that token: due
-- again with it, it was taken back after the check) or its sent mark (nor that run still
-- claimed, being sent, due or waiting with that token). A store put back from an older
-- copy, whatever way, has lost it. (A run trimmed from the history is judged by the counter
-- alone, and so is a run with no token: never claimed, a backfill or a request put it
-- there, over whatever the instant held.)
-- KEYS: the entry's keys. ARGV: name, due, token, what was written (WROTE).
-- Returns '1' (held), '0' (lost) or '' (a record that cannot be read: not judged).
local K = entry_keys(KEYS, ARGV[1])
local e = get_entry(K)
if not e then return '' end
local token = tonumber(ARGV[3])
if not e.anchor or e.token < token then return '0' end
local run = get_run(K, ARGV[2])
if run == false then return '' end
if run == nil then return '1' end
local mine = run.token or 0
if mine == 0 then return '1' end
if mine < token then return '0' end
if mine == token and ((ARGV[4] == WROTE.check and run.state == STATE.claimed)
    or (ARGV[4] == WROTE.sent and (HELD[run.state] or run.state == STATE.due
                                   or run.state == STATE.waiting))) then
  return '0'
end
return '1'
