--[[ reset.lua: the library's function reset: empties a tenant's day and
month counters, for a tier change
with quota "reset" (PATCH /admin/v1/tenants/{id}, or the worker applying a
pending change).

Sets the used units of the day and of the month to 0, when the state's
day and month are those of the change (ARGV[3], ARGV[4]): a state already
in a later period started again from 0 by itself, and is left alone.
Grants (dg, mg) stay: they were given for the period, whatever the tier.
So does the month's overage, and the meters' overage and its millicents
('$'): they are billed, and the spend cap bounds the month's overage
whatever resets happen in it (a reset gives a fresh quota, not a fresh
cap). The GCRA and token bucket are left as they are; so is the pending
usage, which is real usage to flush and bill.

Applied once per reset: the reset's stamp (ARGV[2], the change's time in us)
is kept in field rs of the state hash, and
a reset whose stamp is not above it writes nothing; so the API and the
worker may both send it, any number of times, and usage counted after it
is never emptied by a retry. A tenant with no state has nothing to empty:
nothing is written.

The state's keys, layout and shared functions are lua/state.lua's.
Units, epoch, precision: as in admit.lua.

KEYS[1] the state hash (state.lua)
KEYS[2] the meter quotas' hash (admit.lua, "Meter quotas"), optional: each
        meter's used units of the day and of the month are emptied the
        same way (while they are the change's day and month); its overage
        units and '$' stay

ARGV
  [1] now_us  explicit time in us; 0 = Redis TIME
  [2] stamp   the reset's id: the change's time, us since the epoch (> 0)
  [3] day id of the change (days since the epoch)
  [4] month id of the change (year*100+month)

Return: a flat array of 4 integers
  [1] 1 = reset now; 0 = this reset (or a later one) was applied before;
      -1 = nothing to reset (no state, or it is in later periods)
  [2] day used  [3] month used  [4] month overage  (after this call)
]]

function FN.reset()
KS = KEYS[1]
local now = clock(tonumber(ARGV[1]))

local stamp = tonumber(ARGV[2])
local day, month = tonumber(ARGV[3]), tonumber(ARGV[4])
local s = load_state()

local seen = tonumber(redis.call('HGET', KS, 'rs') or '0')
if seen >= stamp then
  return {0, s.du, s.mu, s.mo}
end
if not s.held then
  return {-1, 0, 0, 0}
end

-- the meter quotas' used units of the change's day and month (their
-- overage and '$' stay)
if KEYS[2] then
  local h = redis.call('HGETALL', KEYS[2])
  for i = 1, #h, 2 do
    local k, v = h[i], h[i + 1]
    local qd, qdu, qm, qmu, qmo = meterq_get(v)
    if qd then
      if qd == day then qdu = 0 end
      if qm == month then qmu = 0 end
      meterq_put(KEYS[2], k, qd, qdu, qm, qmu, qmo)
    end
  end
end

local parts = {}
if s.d == day then
  s.du = 0
  parts[#parts + 1] = 'd'
end
if s.m == month then
  s.mu = 0
  parts[#parts + 1] = 'm'
end
if #parts == 0 then
  return {-1, s.du, s.mu, s.mo}
end
save_state(s, state_need(s, now), nil, now)
redis.call('HSET', KS, 'rs', fmt(stamp))
return {1, s.du, s.mu, s.mo}
end
