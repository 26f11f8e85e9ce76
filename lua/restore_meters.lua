--[[ restore_meters.lua: the library's function restore_meters: give a
tenant's meter quotas (admit.lua, "Meter quotas") their counters back from
the ledger after Redis lost data (internal/billing's Repair, beside
restore.lua).

For each meter: a field absent, or of an earlier month, starts the month
as admit.lua starts it (meterq.lua's meterq_month: the month it held is
kept as the month before, "<meter>|w", for a refund or settlement of its
requests) and a field of an earlier day starts the day; the day and month
then keep the larger of their count and the ledger's units of the day and
month (and the month's overage units): usage counted since the loss is
in the field, usage before it in the ledger, and the larger never counts
a unit twice, and may miss what was pending at the loss, as restore.lua
does. A field of a later month (Redis's clock past the repair's month)
is left as it is. The meters' overage millicents of the month ('$', the
spend cap's: meterq.lua) keep the larger of theirs and the ledger's, so
that the cap's room is not full again after a loss ('$' of an earlier
month moves to '$w', as admission moves it). The hash lives to the end of
the month + 1 h, as admit.lua keeps it.

KEYS[1] <prefix>:v1:{t:<id>}:mq
ARGV [1] day id, [2] month id (of the tenant's calendar), [3] the month's
     end + 1 h, unix ms, [4] the meters' overage of the month by the
     ledger, in millicents (at their quotas' overage prices, as admit.lua
     counts them); then per meter four values: the meter, its day units,
     month units, month overage units.
Return: the number of fields written.
]]
function FN.restore_meters()
local day, month = tonumber(ARGV[1]), tonumber(ARGV[2])
local spent = tonumber(ARGV[4]) - meterq_spent(KEYS[1], month)
if spent > 0 then meterq_spend(KEYS[1], month, spent) end
local n = 0
for i = 5, #ARGV, 4 do
  local meter = ARGV[i]
  local q = meterq_month(KEYS[1], meter, day, month, true)
  if q then
    if q.today then q.du = math.max(q.du, tonumber(ARGV[i + 1])) end
    q.mu, q.mo = math.max(q.mu, tonumber(ARGV[i + 2])), math.max(q.mo, tonumber(ARGV[i + 3]))
    meterq_store(KEYS[1], meter, month, q)
    n = n + 1
  end
end
if n > 0 then redis.call('PEXPIREAT', KEYS[1], ARGV[3]) end
return n
end
