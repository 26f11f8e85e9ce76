--[[ restore_meters.lua: give a tenant's meter quotas (admit.lua, "Meter
quotas") their counters back from the ledger after Redis lost data
(internal/billing's Repair, beside restore.lua).

For each meter: a field absent, or of another day or month, is set to the
ledger's units of the day and month (and the month's overage units); a
field of the same day or month keeps the larger of its count and the
ledger's (usage counted since the loss is in the field, usage before it in
the ledger: the larger never counts a unit twice, and may miss what was
pending at the loss, as restore.lua does). The hash lives to the end of the
month + 1 h, as admit.lua keeps it.

KEYS[1] <prefix>:v1:{t:<id>}:mq
ARGV [1] day id, [2] month id (of the tenant's calendar), [3] the month's
     end + 1 h, unix ms; then per meter four values: the meter, its day
     units, month units, month overage units.
Return: the number of fields written.
]]
local day, month = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = 0
for i = 4, #ARGV, 4 do
  local meter = ARGV[i]
  local du, mu, mo = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local qd, qdu, qm, qmu, qmo = meterq_get(redis.call('HGET', KEYS[1], meter))
  if qd == day then du = math.max(du, qdu) end
  if qd and qm == month then mu, mo = math.max(mu, qmu), math.max(mo, qmo) end
  meterq_put(KEYS[1], meter, day, du, month, mu, mo)
  n = n + 1
end
if n > 0 then redis.call('PEXPIREAT', KEYS[1], ARGV[3]) end
return n
