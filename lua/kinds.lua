--[[ kinds.lua: the limit algebra's kinds, as the admission interpreter
(admit.lua) runs them. internal/limits is their reference (list.go, wire.go,
decide.go, commit.go): the tests hold the two identical, answer by answer and
field by field.

A tenant's limits for requests of one meter are one list, compiled by Go once
per tier, meter, overrides and calendar and sent as one argument, its wire
form (internal/limits/wire.go): entries separated by ';', an entry's fields by
',', the first field its kind:
  r,<T us>,<burst>                 rate (GCRA): one request per T us
  b,<U us>,<capacity>              bucket: one unit back per U us
  q,<d|m>,<meter>,<limit>,<price>  quota of the day or billing month, of one
                                   meter or ("") of every meter; price -1
                                   blocks past the limit, else the units past
                                   it are billed, millicents a unit
  c,<millicents>,<tier price>      the spend cap of the month's overage
  p,<tier price>                   a prepaid tenant's credit
  x,<spec>                         a policy (its algorithm runs in policy.lua;
                                   the request's policies travel beside the
                                   list, with their keys)
list_of reads a wire form once and keeps it (the lists are few: tiers, not
tenants).

Each kind checks a request in a decision x (admit.lua's decide: the state's
counters as it sees them, periods, cost, the refusal so far), in the list's order; a refusal
adds the kind's bit to the mask and keeps the longest wait (-1, never, wins).
The quotas' claims feed the money: a billed quota claims the units past its
limit, billed once (a unit past two quotas by the first), and the cap and the
credit weigh what the claims bill. Commit and report are admit.lua's, entry
by entry, from what the checks left in x.
]]

-- KIND maps an entry's kind to its check, check(x, e) -> nil, or an error
-- reply's text (the credit of a balance of another period).
local KIND = {}
-- list_of returns the list of a wire form: {entries, rate, bucket, meter,
-- sig, fields}, sig the burst limits' "T,B,U,C" (nil without them), fields
-- those of the meter hash its entries read (meterq.lua: the meter's, the
-- spend '$', the credit's draws 'P').
local list_of
-- burst_item reports a rate's or bucket's check c at now: active, limit,
-- remaining, reset.
local burst_item

do
local LISTS, NLISTS = {}, 0

-- QUOTA_BIT and QUOTA_ITEM are a quota entry's refusal bit and item (the
-- tier's day, month, the meter's day, month).
local QUOTA_BIT = {d = 4, m = 8, md = 128, mm = 256}
local QUOTA_ITEM = {d = 3, m = 4, md = 5, mm = 6}

local function entry_of(s)
  local k = string.sub(s, 1, 1)
  if k == 'r' or k == 'b' then
    local t, n = string.match(s, '^.,(%d+),(%d+)$')
    return {k = k, T = t + 0, B = n + 0}
  elseif k == 'q' then
    local p, meter, limit, price = string.match(s, '^q,([dm]),([^,]*),(%d+),(%-?%d+)$')
    local tag = p
    if meter ~= '' then tag = 'm' .. p else meter = nil end
    return {k = k, monthly = p == 'm', meter = meter, limit = limit + 0, price = price + 0,
      bit = QUOTA_BIT[tag], item = QUOTA_ITEM[tag]}
  elseif k == 'c' then
    local limit, price = string.match(s, '^c,(%d+),(%d+)$')
    return {k = k, limit = limit + 0, price = price + 0}
  elseif k == 'p' then
    return {k = k, price = string.match(s, '^p,(%d+)$') + 0}
  elseif k == 'x' then
    return {k = k, spec = string.sub(s, 3)}
  end
  error('tollgate: list entry ' .. s)
end

list_of = function(wire)
  local l = LISTS[wire]
  if l then return l end
  l = {entries = {}, fields = {}}
  for s in string.gmatch(wire, '[^;]+') do
    local e = entry_of(s)
    l.entries[#l.entries + 1] = e
    if e.k == 'r' then l.rate = e elseif e.k == 'b' then l.bucket = e end
    if e.meter and not l.meter then l.meter, l.fields[#l.fields + 1] = e.meter, e.meter end
    if e.k == 'c' then l.fields[#l.fields + 1] = '$' end
    if e.k == 'p' then l.fields[#l.fields + 1] = 'P' end
  end
  local r, b = l.rate, l.bucket
  if r or b then
    l.sig = string.format('%d,%d,%d,%d', r and r.T or 0, r and r.B or 0, b and b.T or 0, b and b.B or 0)
  end
  if NLISTS >= 1000 then LISTS, NLISTS = {}, 0 end
  LISTS[wire], NLISTS = l, NLISTS + 1
  return l
end

-- refuse records a refusal: its bit, and the longest wait (-1 wins).
local function refuse(x, bit, wait)
  x.ok, x.mask = false, x.mask + bit
  if x.retry ~= -1 and (wait < 0 or wait > x.retry) then x.retry = wait end
end

-- burst_check (into c) is the virtual-scheduling check of GCRA (weight 1) and the
-- token bucket (weight cost): t, the time the limit is free of debt, is
-- clamped to the most indebted one the limits allow (a clamp is kept even
-- on a refusal); each unit of weight adds T; the debt may reach B*T.
local function burst_check(x, e, t, weight, bit, c)
  local now, window = x.now, e.B * e.T
  c.e, c.start, c.next, c.clamped = e, t, 0, false
  if c.start < now then c.start = now end
  if c.start > now + window then c.start, c.clamped = now + window, true end
  local wait = 0
  if weight > e.B then
    wait = -1
  else
    c.next = c.start + weight * e.T
    if c.next - now > window then wait = c.next - window - now end
  end
  if wait ~= 0 then refuse(x, bit, wait) end
  return c
end

burst_item = function(c, now, consumed)
  local t, e = c.start, c.e
  if consumed then t = c.next end
  local r = idiv(e.B * e.T - (t - now), e.T)
  if r < 0 then r = 0 end
  return 1, e.B, r, t
end

KIND.r = function(x, e) x.rate = burst_check(x, e, x.g, 1, 1, x.rate_c) end
KIND.b = function(x, e) x.bucket = burst_check(x, e, x.b, x.cost, 2, x.bucket_c) end

-- quota_room returns a quota's used units and limit (the tier's with the
-- period's grants).
local function quota_room(x, e)
  if e.meter then
    if e.monthly then return x.qmu, e.limit end
    return x.qdu, e.limit
  end
  if e.monthly then return x.mu, e.limit + x.mg end
  return x.du, e.limit + x.dg
end
KIND.room = quota_room

-- A quota past its limit refuses (until the period ends; never when the
-- cost alone passes it) or claims the units past it. A replay counts no
-- quota. fresh is what the cost alone would bill in a fresh period (no
-- grant): a cap it passes refuses for good.
KIND.q = function(x, e)
  local n = x.nclaims + 1
  x.nclaims, x.claims[n], x.billed_by[n] = n, e, 0
  local used, limit = quota_room(x, e)
  local cost = x.cost
  if e.price >= 0 then
    local fresh = cost - e.limit
    if fresh < 0 then fresh = 0 end
    x.fresh = x.fresh + (fresh - math.min(fresh, x.fclaimed)) * e.price
    if fresh > x.fclaimed then x.fclaimed = fresh end
  end
  if x.replay or used + cost <= limit then return end
  if e.price < 0 then
    local wait = x.dnext - x.now
    if e.monthly then wait = x.mnext - x.now end
    if cost > e.limit then wait = -1 end
    refuse(x, e.bit, wait)
    return
  end
  local claim = math.min(cost, used + cost - limit)
  local billed = claim - math.min(claim, x.claimed)
  if claim > x.claimed then x.claimed = claim end
  x.billed_by[n], x.billed = billed, x.billed + billed * e.price
end

-- The spend cap bounds the month's overage in millicents: the tier's units
-- at its price, the meters' millicents (x.spent), what the claims bill.
KIND.c = function(x, e)
  x.cap = e
  if x.claimed > 0 and x.mo * e.price + x.spent + x.billed > e.limit then
    local wait = x.mnext - x.now
    if x.fresh > e.limit then wait = -1 end
    refuse(x, 64, wait)
  end
end

-- The credit pays what the claims bill from a prepaid balance (x.pp): the
-- period's draws (its first draw takes the tier's overage admitted in it
-- before, at its price now), 999 millicents per invoice line past the first,
-- the previous period's draws past what it may draw; without room the
-- request is refused for good. A balance of another period is an error.
KIND.p = function(x, e)
  local pp = x.pp
  if not pp then return end
  if pp.id ~= x.month then return 'PREPAID ' .. fmt(x.now) end
  x.credit = e
  local d = x.S.draws
  local m, mc, pm, pmc = d[1], d[2], d[3], d[4]
  x.pfresh = false
  if m == 0 then m, mc, pm, pmc = -1, 0, -1, 0 end
  if m ~= x.month then
    m, mc, pm, pmc, x.pfresh = x.month, x.mo * e.price, m, mc, true
  end
  x.draws = {m, mc, pm, pmc}
  local lines = pp.lines
  if lines < 1 then lines = 1 end
  local held = mc + 999 * (lines - 1)
  if pp.prev ~= 0 and pm == pp.prev and pmc > 0 then
    held = held + math.max(0, pmc + 999 * lines - pp.exp)
  end
  if x.billed > 0 and not x.replay and held + x.billed > pp.bal then
    x.ok, x.mask, x.retry = false, x.mask + 512, -1
  end
end

-- a policy entry: the request's policies are decided beside the list
-- (admit.lua's policies step)
KIND.x = function() end
end
