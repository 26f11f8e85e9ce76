--[[ epoch.lua: the library's function epoch: raise a master's epoch key to
a generation, never lower it.

Each worker, after the claims of its cycle, raises every master's epoch key
to the generation after the last one Postgres confirmed, then confirms it
there. A master that comes back from older data (a restart from files
behind its last writes, a failover to a replica that lagged) holds a lower
generation than Postgres: the claims made after its data ended, and
recorded since, would be claimed again (internal/pending, EpochState).
Workers raise it at once, so a key is only ever raised.

KEYS[1] the epoch key of a master (internal/pending: epochKeys)
ARGV[1] the generation, a decimal integer
Return: 1 when raised; 0 when the key is gone (it stays gone: a loss), is
marked restoring (the restore sets it when done), or holds this
generation or a later one.
]]
function FN.epoch()
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local gen = tonumber(ARGV[1])
local cur = 0
if v ~= 'intact' then
  local n = string.match(v, '^intact:(%d+)$')
  if not n then
    return 0
  end
  cur = tonumber(n)
end
if cur >= gen then
  return 0
end
redis.call('SET', KEYS[1], 'intact:' .. ARGV[1], 'KEEPTTL')
return 1
end
