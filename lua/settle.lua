--[[ settle.lua: the library's function settle: settle a request admitted on
a route with settle: true to the cost its upstream reported (the Tollgate-Actual-Cost response header or
POST /v1/settle), exactly once.

The state's keys, layout and shared functions are lua/state.lua's, with
meterq.lua's and adjust.lua's (the changes it shares with refund.lua). The admission wrote a settle entry
(internal/ratelimit/settle.go) under the tenant's hash tag, living 10
minutes. This script reads it and, in the same atomic call, marks it settled (the value "done", keeping its expiry) and
applies the difference between the actual cost and the admitted cost, in
the day, the month and the hour the request was admitted in:
  actual < cost: the difference is given back as refund.lua gives back a
    failed request, its last units first: of those, the meter's overage
    the request took, then the tier's (a request's units past both
    monthly quotas are its last ones, and the meter's overage only),
    never more overage than the request took;
  actual > cost: the difference is added to the day and month counters
    and to the pending usage, unconditionally: a charge may pass the
    quota, and later requests are refused. On a bill tier the units past
    the month's quota + grants are overage, as admit.lua counts them (a
    unit past a billed meter quota too is the meter's overage only), but
    a month never bills more overage than its spend cap: the overage is
    billed, in the order the units were charged (the tier's, then the
    meter's, as admit.lua orders them), while the cap's room in the
    admission's month lasts (capm less the month's overage at its
    prices: the tier's units at tprice, the meters' millicents '$');
    the units past it count as usage, not as overage (adjust.lua's
    adjust_charge, which outage.lua's usage shares).
The admission's month is the state's, or, after the next month began (an
admission there rolled the counters: this arrives within the entry's 10
minutes), the month before, which the state keeps beside it (state.lua's
field w, meterq.lua's "<meter>|w" and '$w') and this moves instead. So a
settlement after the roll rates the overage exactly as it would have
before it: several requests of the month before, settled in any order
after the roll, bill what they would have settled before it, and the new
month's counters and spend cap are never touched. A day or month that
Redis no longer holds (a data loss) changes nothing there; the charge is
then counted as usage without the overage of those counters.
A second settle of the entry finds "done" and changes nothing; an entry
that expired is gone: both change nothing.

KEYS
  KEYS[1] the state hash (state.lua)
  KEYS[2] <prefix>:v1:{t:<id>}:pending (as refund.lua)
  KEYS[3] <prefix>:v1:{t:<id>}:settle:<request id>, the entry:
          "<cost>|<hour start unix s>|<day id>|<month id>|<overage>|<bill 0/1>|<monthly quota, -1 none>|<money>|<meter>"
          where money is '-' when the meter has no quota, the tenant is
          postpaid and its tier has no spend cap, else
          "<q>,<mq>,<price>,<capped>,<mover>,<tpp>,<capm>,<tprice>": q 1
          when the meter has a quota; its monthly quota (-1 none), its
          overage price per 1,000 (-1 not billed), capped 1 when the spend
          cap counts the meters' overage ('$'), mover the meter overage
          units of the admission; tpp a prepaid tenant's tier overage
          price (-1: postpaid), whose credit draws the difference's
          overage too (the tier's at tpp, the meter's at its price:
          meterq.lua's prepaid_adjust); capm the spend cap in millicents
          (-1 none) and tprice the tier's overage price (0 unless it
          bills). Entries of a node before these (a rolling upgrade: "-" or
          "<mq>,<price>,<capped>[,<tpp>]") are read as they were written:
          without mover the meter gives back its month's overage first, as
          those nodes did, and without capm no cap bounds a charge
  KEYS[4] <prefix>:v1:{t:<id>}:mq, the meter quotas' hash (meterq.lua)

ARGV
  [1] the actual cost, 0..quota.MaxQuantity
  [2] the entry's mark once applied: "done" (a settle; absent: "done"),
      or "refunded" (a check's refund, a settle to 0)

Return: {status, delta, overage delta}: status 1 applied, 0 no entry
(unknown or expired), -1 settled before, -2 refunded before; delta = actual - cost (negative
for a refund); overage delta the change of the month's (tier's) overage
units.
]]

function FN.settle()
KS = KEYS[1]
local e = redis.call('GET', KEYS[3])
if not e then return {0, 0, 0} end
if e == 'done' then return {-1, 0, 0} end
if e == 'refunded' then return {-2, 0, 0} end
redis.call('SET', KEYS[3], ARGV[2] or 'done', 'KEEPTTL')

local cost, hour, day, month, over, bill, mq, mspec, meter = string.match(e,
  '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([01])|(%-?%d+)|([%d,%-]+)|(.+)$')
if not cost then
  -- an entry of a node before meter quotas (no meter quota field)
  mspec = '-'
  cost, hour, day, month, over, bill, mq, meter = string.match(e,
    '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|([01])|(%-?%d+)|(.+)$')
end
if not cost then return redis.error_reply('settle: bad entry') end
cost, over, mq = tonumber(cost), tonumber(over), tonumber(mq)
day, month = tonumber(day), tonumber(month)
local actual = tonumber(ARGV[1])
local diff = actual - cost
if diff == 0 then return {1, 0, 0} end

-- the money of the entry: hasq, the meter's quota and price, capped, the
-- meter overage taken (nil: unknown, an older entry), the prepaid tier
-- price (nil: postpaid), the spend cap and the tier's price
local hasq, qmq, price, capped, took, tpp, capm, tprice = false, -1, -1, false, nil, nil, -1, 0
if mspec ~= '-' then
  local a = {}
  for v in string.gmatch(mspec, '[^,]+') do a[#a + 1] = v end
  if #a == 8 then
    hasq, qmq, price, capped, took = a[1] == '1', a[2] + 0, a[3] + 0, a[4] == '1', a[5] + 0
    if a[6] + 0 >= 0 then tpp = a[6] + 0 end
    capm, tprice = a[7] + 0, a[8] + 0
  elseif #a == 3 or #a == 4 then
    hasq, qmq, price, capped = true, a[1] + 0, a[2] + 0, a[3] == '1'
    if a[4] and a[4] ~= '' then tpp = a[4] + 0 end
  end
end
local mpp = math.max(price, 0)

local now = clock(0)

local s = load_state()
-- the admission's month (state.lua) and its meter's counters (meterq.lua)
local c = month_load(s, month)
local q = hasq and meterq_month(KEYS[4], meter, day, month)
-- ovd, mdov: the change of the tier's and the meter's overage units
local ovd, mdov
if diff < 0 then
  ovd, mdov = adjust_give_back(-diff, over, took, q and q.mo)
else
  -- the charged units past the quotas, within the admission month's cap
  ovd, mdov = adjust_charge(c, q, diff, bill == '1', mq, qmq, price, capm, tprice, KEYS[4], month)
end
adjust_counters(s, c, q, KEYS[4], meter, day, month, diff, ovd, mdov, now)
if not capped then price = -1 end
adjust_money(KEYS[4], month, ovd, mdov, price, tpp, mpp)
adjust_pending(s, KEYS[2], hour .. '|' .. meter .. '|', diff, ovd, mdov)
return {1, diff, ovd}
end
