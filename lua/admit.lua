--[[ admit.lua: the admission interpreter, the library's functions admit
(one request) and, through admit_run, admitn (a group of one tenant's
requests: group.lua).

A request meets its tenant's list of limits (kinds.lua): admit reads the
tenant's state once, checks every entry of the list, in its order, and only
when all of them pass (and the request's policies too) commits each; a refusal
commits nothing but a clamp of the burst limits and the count of the refusal.
Then it writes the state once. A group decides its requests in order on the
state read once, each exactly as it would be decided alone, and writes once.
internal/limits is the reference (decide.go, commit.go, periods.go).

KEYS, ARGV and the answer are POS.admit's (internal/limits/positions.go):
  KEYS state (the tenant's hash, state.lua), pending (the pending hash of a
       tenant without state), meters (the meter quotas' and money hash,
       meterq.lua), idem (an idempotency record, optional), then the keys of
       the request's policies
  ARGV now (us; 0: Redis TIME), mode ('admit'; 'dry' decides and writes
       nothing; 'peek' reports, cost 1), list (the wire form), cost, meter
       (its pending usage), request_id (the policies' leases), fingerprint
       and lease (us in flight) of an idempotent request, calendar
       (calendar.lua's boundaries; '' the default), prepaid
       ("bal,bid,prev,lines,pexp", '' postpaid: admit.lua of before,
       "Prepaid"), outside (what the policies of other slots made of the
       request: letters x refused, d degraded, s shadow), policies (their
       number), then policy.lua's POLICY_ARGS for each
  answer: allowed, mask, retry, overage, now, idem, then the six items
       (burst, bucket, daily, monthly, the meter's daily and monthly: active,
       limit, remaining, reset), the meter's overage, then POLICY_ITEM per
       policy (a list without a meter quota and a request without
       policies: the first 22 only, the tier's); an error reply "CALENDAR <now>" (now outside the days Go
       sent: it sends those of this now) or "PREPAID <now>" (a balance of
       another period), having written nothing.

Masks: 1 burst, 2 bucket, 4 daily, 8 monthly, 16 a policy, 32 degraded, 64
the spend cap, 128 and 256 the meter's daily and monthly quotas, 512 credit.
The state's layout is state.lua's (internal/limits/state.go names each
field). After an admission, remaining and reset describe the state after
it; after a refusal, in dry runs and in peeks, the state as it is.

Limit changes: fresh or clamp
  GCRA and the bucket keep their state as a time (TAT, FULL), and the
  hash's field L = "T,B,U,C" (the list's rate and bucket) names the limits it was
  written under: one more field of the HMGET, and one string comparison
  per call (L is written only when it changes). Under other limits than
  L's, each of GCRA and the bucket whose new limits are each at least as
  large (T <= L's T and B >= L's B; U <= L's U and C >= L's C; both
  limited) starts fresh: its state is read as 0, no debt, so an upgrade
  never leaves more waiting than the new limits allow. Any other change
  (a move down, a faster rate with a smaller burst, a limit that was
  unlimited, no L yet) keeps the state, clamped to the most
  indebted state the CURRENT limits allow: TAT <= now + B*T and FULL <=
  now + C*U. Under unchanged limits the clamp never bites (admissions keep
  both below it), so it changes nothing there; after a change of limits
  the next request waits at most one new interval (T, or cost*U): the new
  limits' own worst case. L is written with any write of the state in
  admit mode. A clamped time is written back in admit mode even when the
  request is refused: it consumes nothing (it is the state the old one
  means under the new limits), and without it every later request would
  be clamped, and refused, anew; a fresh start needs no write (it is read
  again the same until an admission writes the state and L).

GCRA (counts requests, 1 per request whatever the cost)
  tat = min(max(TAT, now), now + B*T); new = tat + T; allowed iff new - now <= B*T.
  remaining = floor((B*T - (new - now)) / T), reset = new (full again),
  refusal retry = new - B*T - now. Never more than B + t/T requests are
  admitted in any window of length t. T is 1e6/rate rounded to a whole us, so
  the real rate is 1e6/T: off by at most 0.5/T relative to the configured one.

Token bucket (counts cost units), in virtual-scheduling form
  State FULL = the time the bucket is full again; U = us per unit of refill;
  C = capacity. This is exactly a continuously refilled bucket with
  tokens(now) = C - max(0, FULL - now) / U.
  f = min(max(FULL, now), now + C*U); new = f + cost*U; allowed iff new - now <= C*U
  (i.e. tokens >= cost); remaining = floor((C*U - (new - now)) / U);
  retry = new - C*U - now; cost > C never passes (retry -1).

Quotas (count cost units per day / billing month of the tenant's calendar:
UTC days and calendar months by default; see "Calendars")
  A hash whose period is not the current one counts as empty. limit = quota
  + grant of the current period; remaining = max(0, limit - used); reset =
  start of the next period; refusal retry = next period start - now, or -1
  when cost > quota (a fresh period has no grant).
  Overage policy applies to the MONTHLY quota only: 'block' refuses past
  quota + grant; 'bill' admits and returns the units past quota + grant as
  overage (added to the month hash and to pending usage). The daily quota is
  always a hard cap, and GCRA and the bucket always refuse: overage billing
  is a promise about the month's volume, not a licence to burst.
  Spend cap (a cap entry): a request whose claims would bring the month's
  overage money past the cap (see "Meter quotas") is refused (mask 64),
  consuming nothing; retry = next month start - now, or -1 when the cost
  alone would bill past the cap in a fresh month (which has no grant).

Calendars (the calendar argument not '')
  A tenant's billing calendar (quota.Calendar: an anchor day 1..28 and an
  IANA zone) makes its days run from local midnight to local midnight (23
  or 25 hours across a DST change) and its months from the anchor day's
  local midnight to the next month's. Lua knows no zones, and now is Redis
  TIME, not Go's: Go passes the days and periods around its own now
  (calendar.lua), and cal_at picks those of the script's now: the day id
  (the local date as days since 1970-01-01), the next day's start, the
  period id (year*100+month of its anchor day) and the next period's start,
  which are d, dnext, m and mnext below; the resets follow them, and the
  meter quotas' periods are the same. The state's layout does not change:
  t's base d*DAY_US is an offset base only, so a local day id serves as
  well. The month's cached end (c's mn, the default calendar's fast path)
  is never used with a calendar and is kept 0, so that a tenant moved back
  to the default calendar computes its month again. A calendar that changes
  (another zone or anchor) changes the ids: counters whose id is still the
  current one carry on, the others start again from 0 (as at any new day
  or month). When the script's now is outside the days Go sent (the
  clocks more than about a day apart), the call answers the error
  "CALENDAR <now us>" and writes nothing; Go computes the boundaries of
  that now and calls once more. The default calendar ('' or absent) takes
  the UTC path, at no cost but the test of its argument.

Policies (np > 0)
  Decided with the tier's limits, all or nothing: policies_check (policy.lua)
  reads each one's key after the tier's checks; a refusing enforced policy
  (reject, queue) refuses the request (mask 16); a refusing degrade policy,
  when everything else admits, makes it degraded (mask 32): not admitted,
  nothing consumed, counted as degraded; a refusing shadow policy refuses
  nothing and is counted as a shadow refusal. An admitted request commits
  every policy that admitted it, in the same call. Peek and dry runs check
  and write nothing. Pending fields: "|d" degraded, "|s" shadow refusals.

Meter quotas (the list's quota entries of a meter)
  A tier's quota of one meter (quota.MeterQuota), beside the tier-wide
  ones and decided with them, all or nothing. Its state is one field of
  the hash <prefix>:v1:{t:<id>}:mq (KEYS meters), named by the meter:
  "d,du,m,mu,mo" (day id and units, month id, units and overage units, the
  ids as q's), and the field '$' = "m,mc": the millicents (1/1000 cent) of
  all meters' overage of month m, for the spend cap. When a meter's field,
  or '$', moves on to a new month, the month that ends is kept beside it
  ("<meter>|w" = "m,mu,mo", '$w' = "m,mc": meterq.lua), for refunds and
  settlements of its requests that arrive after the roll. The periods are the
  tier-wide quotas' (d, m above). The daily quota is a hard cap (mask 128,
  retry as the tier's); the monthly one refuses (256) or, billed, admits
  past it: the units past it are the meter's overage ('|m' pending field),
  and a unit past the tier-wide monthly quota too is the meter's overage
  only (taken off the tier's, so no unit is billed twice). The spend cap is
  checked in millicents over both, whatever plan billed the month's '$':
  (tier overage units) * tier price + mc + (meter overage) * price <= cap
  (exact: each term is below 2^53 until the sum is past cap <= 2^50, and a
  double past 2^53 still compares greater). The hash lives to the end of the
  month of its last write + 1 h (PEXPIREAT when a field's month changes).
  Replays answer the meter items as they are now.

Prepaid (a credit entry, the prepaid argument "bal,bid,prev,lines,pexp")
  A prepaid tenant's units past its monthly quotas (the tier's overage at
  tprice and the meter's at price, as billed) are paid from its credit,
  drawn down here, atomically with the limits: the field 'P' of the meter
  quotas' hash is "m,mc,pm,pmc": the millicents that the admissions of
  period m drew, and of the period pm before it. bal is what they may draw
  (quota.Prepaid.BalanceMillicents, billing.Ledger.Prepaid: the credit
  that pays period bid's invoice, left once every invoice not final yet
  has drawn its share, less the charges of bid's invoice that admissions
  do not draw; the draws Redis counts are not in it; it may be
  negative), bid the period it is for and prev the period before it
  while its invoice is not final (0 once it is: its draws are then on
  the ledger, out of bal), lines the invoice lines a period's draws are
  rated on (each rounded up to the cent: 999 millicents are kept back per
  line past the first, of this period's lines and of prev's when it
  drew), pexp (quota.Prepaid.ExpiringMillicents) what prev's draws may
  reach before they take anything off bal: the credit prev's invoice
  draws first that does not pay bid's (it expires before bid ends), less
  prev's charges that admissions do not draw; or prev's overage charges
  as the ledger rates them, when more (bal holds those back already);
  or 2^53, which no draws reach, when prev's invoice takes all the credit
  it shares with bid's whatever it drew. A request whose cost would
  bring mc + 999 * (lines - 1) + max(0, pmc + 999 * lines - pexp) (that
  last term only while pm = prev and pmc > 0) past bal is refused (mask
  512, retry -1: no wait brings credit back), consuming nothing; a
  balance of another period
  than now's is an error "PREPAID <now us>" (Go reads the balance of that
  period and calls again). While prepaid, the hash lives 40 days past the
  end of its month, so that pmc outlasts the previous invoice's grace.

Idempotency (KEYS idem present, mode 'admit')
  A record younger than 24 h (by its own 'at', so that explicit test times
  see the same window) decides first: another fingerprint is a mismatch (3);
  a 'run' record whose lease has not passed is in flight (2); a 'done' record
  is replayed (1): the replay still passes GCRA and the bucket (it is load),
  which it consumes, but no quota and no pending usage; its answer is the
  stored decision with the burst and bucket items of now. Its policies
  decide it as any request's (a full one refuses it) and the rate limits
  among them are spent, but it takes no concurrency lease (policy.lua's
  policies_commit): it is answered at once, and nothing would release it.
  A refused replay is an ordinary refusal. A 'run' record past its lease (its node died) is
  a new attempt. Only allowed first attempts write a record: a refusal
  consumed nothing, so a retry with the same key is a new attempt. Dry runs
  and peeks ignore the key.

Expiry (each key lives no longer than its state needs, give or take an hour)
  the state hash: until the end of its month (or day, or TAT/FULL,
  whichever is last) + 1 h, sent only when that passes the expiry it has
  (field x), and 14 days after an admission's pending usage; idem: 24 h;
  the pending hash: 14 days after
  the first write of a field (so at least hourly while the tenant is
  active; the worker flushes it far sooner, the TTL only bounds what an
  abandoned tenant leaves behind). Expiries are absolute in script time;
  with an explicit now in the past they are shifted by (TIME - now), so
  that test state lives as long as it would have.
]]

-- admit_run decides reqs, {K = keys, A = args} each, of one tenant in
-- order, on one read and one write of its state; it returns their answers.
-- With isolate, a request that raises an error is answered its error
-- reply (it has changed nothing), the others decided as without it.
local admit_run

do
local A, KY = POS.admit.args, POS.admit.keys
-- NARGS is the number of admit's arguments before the policies' groups
-- (policies, their number, is the last).
local NARGS = A.policies
local IDEM_US = DAY_US
local PENDING_US = 14 * DAY_US
local PENDING_MS = 14 * 86400 * 1000
local PREPAID_KEEP_US = 40 * DAY_US

-- num is integer v for a concatenation: v itself below 1e14 (Lua's
-- '..' writes such a number exactly, as %d does, at a fraction of
-- string.format's cost), else fmt's string.
local function num(v)
  if v < 1e14 and v > -1e14 then return v end
  return fmt(v)
end

local function ints(v)
  local s = {}
  for n in string.gmatch(v, '[^,]+') do s[#s + 1] = n + 0 end
  return s
end

-- A buffer holds a hash's writes until the end, in the order first
-- written: b[i] the i-th field, b[field] its value to set (a string; true
-- for t, q and c, the state's; false for one not written after all), or
-- b[ADD][field] what to add to a counter. ADD is a key no field name is.
local ADD = {}
local function buffer() return {[ADD] = {}} end

local function put(b, f, v)
  if b[f] == nil and b[ADD][f] == nil then b[#b + 1] = f end
  b[f] = v
end

local function add(b, f, n)
  local a = b[ADD]
  if b[f] == nil and a[f] == nil then b[#b + 1] = f end
  a[f] = (a[f] or 0) + n
end

-- flush writes buffer b into the hash key (runs of fields in one HSET,
-- HINCRBY for counters) and empties it; it reports whether a counter was
-- new (the hash may be new: its expiry is the caller's).
local ARGS = {}
local function flush(key, b)
  local a, n, new = b[ADD], 0, false
  for i = 1, #b do
    local f = b[i]
    local v = b[f]
    if v then
      ARGS[n + 1], ARGS[n + 2], n = f, v, n + 2
    elseif v == nil then
      if n > 0 then redis.call('HSET', key, unpack(ARGS, 1, n)) end
      n, new = 0, redis.call('HINCRBY', key, f, a[f]) == a[f] or new
    end
  end
  if n > 0 then redis.call('HSET', key, unpack(ARGS, 1, n)) end
  for i = #b, 1, -1 do
    b[b[i]], a[b[i]], b[i] = nil, nil, nil
  end
  return new
end

-- S is the state of the call running, X the decision at work: made once,
-- their fields reset for each call (a table made per call costs Redis's
-- Lua more than all the arithmetic of a decision). Never nil a field: a
-- table keeps its keys' room.
local ZERO2, ZERO4, NONE, NO_METER = {0, 0}, {0, 0, 0, 0}, {}, {-1, 0, -1, 0, 0}
-- HELD is S.t0 when the hash holds the state: its TAT, FULL, day and
-- month end as read (t and c are written only when they change), q's
-- counters but du and mu, and their strings
local HELD = {0, 0, 0, 0, dg = 0, m = 0, mg = 0, mo = 0, gn = 0, ds = '', dgs = '', ms = '', tail = ''}
local S = {ks = false, kp = false, kq = false, held = false, x0 = 0, g = 0, b = 0, d = -1, du = 0, dg = 0,
  m = -1, mu = 0, mg = 0, mo = 0, gn = 0, x = 0, mn = 0, L = false, dropg = false, kqx = false, t0 = false,
  spent = ZERO2, draws = ZERO4, usage = {}, meters = NONE, th = buffer(), ph = buffer(), qh = buffer(), f = {}, nf = 0}
-- RES is the answer report fills: a lone admission's, made once (Redis
-- reads it before the next call); false in a group, whose answers are
-- each their own.
local RES, ANSWER = false, {}
local X = {S = S, q = false, l = false, now = 0, mode = false, cost = 0, meter = false, pk = false,
  rate_c = {}, bucket_c = {}, claims = {}, billed_by = {}, nclaims = 0}

-- meter_fields reads the meter hash's fields that reqs' lists use.
local function meter_fields(reqs)
  local mf = nil
  for i = 1, #reqs do
    local fs = reqs[i].l.fields
    for j = 1, #fs do
      mf = mf or {}
      if not mf[fs[j]] then mf[#mf + 1], mf[fs[j]] = fs[j], true end
    end
  end
  S.spent, S.draws, S.meters = ZERO2, ZERO4, NONE
  if not mf then return end
  S.meters = {}
  local h = redis.call('HMGET', S.kq, unpack(mf))
  for i, name in ipairs(mf) do
    if h[i] and name == '$' then S.spent = ints(h[i])
    elseif h[i] and name == 'P' then S.draws = ints(h[i])
    elseif h[i] then S.meters[name] = ints(h[i]) end
  end
end

-- state_read reads the tenant's hash (t, q, c, L and the pending usage
-- fields reqs count: state.lua's layout) into S, and the meter hash.
local function state_read(reqs)
  local K = reqs[1].K
  S.ks, S.kp, S.kq, S.held, S.x0, S.g, S.b, S.d, S.du, S.dg = K[KY.state], K[KY.pending], K[KY.meters],
    false, 0, 0, 0, -1, 0, 0
  S.m, S.mu, S.mg, S.mo, S.gn, S.x, S.mn, S.dropg, S.kqx, S.t0 = -1, 0, 0, 0, 0, 0, 0, false, false, false
  local f, n = S.f, 4
  for i = 5, S.nf do S.usage[f[i]] = nil end
  f[1], f[2], f[3], f[4] = 't', 'q', 'c', 'L'
  for i = 1, #reqs do
    if reqs[i].pk then n = n + 1; f[n] = reqs[i].pk end
  end
  S.nf = n
  local h = redis.call('HMGET', S.ks, unpack(f, 1, n))
  S.L = h[4]
  for i = 5, n do S.usage[f[i]] = h[i] end
  if h[1] then
    local g, b = string.match(h[1], '^(%-?%d*),(%-?%d*)$')
    -- (the tail, mg,mo,gn, is a capture too: q is written again from the
    -- strings read when only du and mu changed)
    local d, du, dg, m, mu, tail, mg, mo, gn = string.match(h[2],
      '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),((%-?%d+),(%-?%d+),(%-?%d+))$')
    local x, mn = string.match(h[3], '^(%-?%d+),(%-?%d+)$')
    S.held, S.d, S.du, S.dg, S.m, S.mu, S.mg, S.mo, S.gn = true, d + 0, du + 0, dg + 0, m + 0, mu + 0, mg + 0,
      mo + 0, gn + 0
    if g ~= '' then S.g = g + S.d * DAY_US end
    if b ~= '' then S.b = b + S.d * DAY_US end
    S.x, S.mn = x * HOUR_US, mn * DAY_US
    S.x0, S.t0 = S.x, HELD
    HELD[1], HELD[2], HELD[3], HELD[4] = S.g, S.b, S.d, S.mn
    HELD.dg, HELD.m, HELD.mg, HELD.mo, HELD.gn = S.dg, S.m, S.mg, S.mo, S.gn
    HELD.ds, HELD.dgs, HELD.ms, HELD.tail = d, dg, m, tail
  end
  if #reqs > 1 or #reqs[1].l.fields > 0 then
    meter_fields(reqs)
  else
    S.spent, S.draws, S.meters = ZERO2, ZERO4, NONE
  end
end

-- decision starts X's decision of request q on S: the request, and the
-- state's counters as it sees them (g TAT, b FULL, the day's and month's,
-- xp the expiry, mn the month's cached end).
local function decision(q)
  local x, Aq = X, q.A
  x.q, x.l, x.now, x.mode, x.cost, x.meter, x.pk = q, q.l, q.now, Aq[A.mode], Aq[A.cost] + 0, Aq[A.meter], q.pk
  x.ok, x.mask, x.retry, x.replay, x.idem = true, 0, 0, false, false
  x.g, x.b, x.d, x.du, x.dg, x.m, x.mu, x.mg, x.mo, x.gn = S.g, S.b, S.d, S.du, S.dg, S.m, S.mu, S.mg, S.mo, S.gn
  x.xp, x.mn, x.w, x.rolled, x.relim = S.x, S.mn, false, false, false
  x.rate, x.bucket, x.nclaims, x.claimed, x.billed, x.fresh, x.fclaimed, x.spent = false, false, 0, 0, 0, 0, 0, 0
  x.pp, x.credit, x.cap, x.precs, x.shadowed = false, false, false, false, false
  -- (periods sets day, dnext, month, mnext; report overage and moverage;
  -- the credit draws and pfresh)
  return x
end

-- periods moves the decision's counters into now's day and month (a
-- past period's start from 0; a month that ends becomes the month
-- before, w). The default calendar trusts the cached month end within 31
-- days before it; a calendar's ids come from Go's boundaries. False: now
-- is outside them.
local function periods(x, cal)
  local now, day, dnext, month, mnext, _ = x.now
  if cal then
    day, _, dnext, month, _, mnext = cal_at(cal, now)
    if not day then return false end
  else
    day = idiv(now, DAY_US)
    dnext = (day + 1) * DAY_US
  end
  if day ~= x.d then x.d, x.du, x.dg = day, 0, 0 end
  if not cal and now < x.mn and now >= x.mn - 31 * DAY_US and x.m >= 0 then
    month, mnext = x.m, x.mn
  else
    if not cal then month, _, mnext = month_at(now) end
    if month ~= x.m then
      if x.m >= 0 and x.m < month then x.w = month_pack(x.m, x.mu, x.mg, x.mo) end
      x.m, x.mu, x.mg, x.mo, x.rolled = month, 0, 0, 0, true
    end
    x.mn = cal and 0 or mnext
  end
  x.day, x.dnext, x.month, x.mnext = day, dnext, month, mnext
  return true
end

-- limit_change: under other burst limits than the state's (L), each of
-- GCRA and the bucket at least as large in rate and burst starts fresh;
-- any other change keeps the state (the checks clamp it).
local function limit_change(x)
  local l = x.l
  if not l.sig or l.sig == x.S.L then return end
  x.relim = true
  local T, B, U, C = string.match(x.S.L or '', '^(%d+),(%d+),(%d+),(%d+)$')
  if not T then return end
  local r, b = l.rate, l.bucket
  if r and T + 0 > 0 and r.T <= T + 0 and r.B >= B + 0 then x.g = 0 end
  if b and U + 0 > 0 and b.T <= U + 0 and b.B >= C + 0 then x.b = 0 end
end

-- meter_view reads the list's meter's counters (qd, qdu, qm, qmu, qmo) moved to now's day and
-- month (qfresh: its month changed; qold, the month it held, kept as
-- <meter>|w).
local function meter_view(x)
  local f = x.S.meters[x.l.meter] or NO_METER
  x.qd, x.qdu, x.qm, x.qmu, x.qmo, x.qfresh, x.qold = f[1], f[2], f[3], f[4], f[5], false, false
  if x.qd ~= x.day then x.qd, x.qdu = x.day, 0 end
  if x.qm ~= x.month then
    if x.qm >= 0 and x.qm < x.month then x.qold = string.format('%d,%d,%d', x.qm, x.qmu, x.qmo) end
    x.qm, x.qmu, x.qmo, x.qfresh = x.month, 0, 0, true
  end
end

-- idem_check reads the request's idempotency record: nil to decide, or
-- the code of a request in flight (2) or a mismatch (3); a done record
-- sets x.replay, its stored decision.
local function idem_check(x)
  local h = redis.call('HMGET', x.idem, 'fp', 'st', 'dec', 'lease', 'at')
  if not h[1] or h[5] + IDEM_US <= x.now then return nil end
  if h[1] ~= x.q.A[A.fingerprint] then return 3 end
  if h[2] == 'run' and h[4] + 0 > x.now then return 2 end
  if h[2] == 'done' then x.replay = ints(h[3]) end
  return nil
end

-- policies decides the request's policies (policy.lua) beside the list:
-- an enforced refusal refuses, a degrade one degrades a request nothing
-- else refuses, a shadow one is counted.
local function policies(x)
  local q = x.q
  local np, outside = q.A[A.policies] + 0, q.A[A.outside]
  if np == 0 and outside == '' then return end
  KEYS, ARGV = q.K, q.A -- (policy.lua reads the call's; a group's are sliced)
  local pass, degr, wait, recs = policies_check(#q.K - np + 1, NARGS + 1, np, x.now, q.A[A.request_id])
  x.precs = recs
  if string.find(outside, 'x', 1, true) then pass = false end
  if string.find(outside, 'd', 1, true) then degr = true end
  if string.find(outside, 's', 1, true) then x.shadowed = true end
  for _, r in ipairs(recs) do
    if r.outcome == 2 then x.shadowed = true end
  end
  if not pass then
    x.ok, x.mask = false, x.mask + 16
    if x.retry ~= -1 and (wait < 0 or wait > x.retry) then x.retry = wait end
  elseif degr and x.ok then
    x.ok, x.mask = false, x.mask + 32
  end
end

-- report is the answer: the overage the claims bill when consumed, and
-- every limit after an admission as it leaves it, else as it stands.
local function report(x)
  local consumed = x.ok and x.mode ~= 'peek'
  if x.ok then x.retry = 0 end
  -- (a list without a meter quota, and no policies: the 22 integers
  -- before the meter's items, which Redis converts at a cost each)
  local n = 31
  if not x.l.meter and not x.precs then n = 22 end
  local res = RES
  if res then
    for i = #res, n + 1, -1 do res[i] = nil end -- (the items of the last call)
    for i = 15, n do res[i] = 0 end
    res[1], res[2], res[3], res[4], res[5], res[6] = x.ok and 1 or 0, x.mask, x.retry, 0, x.now, 0
  elseif n == 22 then
    res = {x.ok and 1 or 0, x.mask, x.retry, 0, x.now, 0,
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  else
    res = {x.ok and 1 or 0, x.mask, x.retry, 0, x.now, 0,
      0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  end
  if x.rate then
    res[7], res[8], res[9], res[10] = burst_item(x.rate, x.now, consumed)
  else
    res[7], res[8], res[9], res[10] = 0, 0, 0, 0
  end
  if x.bucket then
    res[11], res[12], res[13], res[14] = burst_item(x.bucket, x.now, consumed)
  else
    res[11], res[12], res[13], res[14] = 0, 0, 0, 0
  end
  local spent, over, mover = 0, 0, 0
  if consumed then spent = x.cost end
  for i = 1, x.nclaims do
    local e = x.claims[i]
    if consumed and e.meter then mover = mover + x.billed_by[i]
    elseif consumed then over = over + x.billed_by[i] end
    local used, limit = KIND.room(x, e)
    local j = 3 + 4 * e.item
    local left = limit - used - spent
    if left < 0 then left = 0 end
    res[j], res[j + 1], res[j + 2] = 1, limit, left
    res[j + 3] = e.monthly and x.mnext or x.dnext
  end
  res[4], x.overage, x.moverage = over, over, mover
  if n == 31 then res[31] = mover end
  if not consumed then x.billed = 0 end
  return res
end

-- commit_meter counts an admission in its meter's field (the month it
-- ends kept as <meter>|w), and its meter overage in the month's spend
-- ('$', the month before as '$w') when there is a cap.
local function commit_meter(x, price)
  local S, m = x.S, x.l.meter
  x.qdu, x.qmu, x.qmo = x.qdu + x.cost, x.qmu + x.cost, x.qmo + x.moverage
  S.meters[m] = {x.qd, x.qdu, x.qm, x.qmu, x.qmo}
  put(S.qh, m, string.format('%d,%d,%d,%d,%d', x.qd, x.qdu, x.qm, x.qmu, x.qmo))
  if x.moverage > 0 and x.cap then
    local sp = S.spent
    if sp[1] ~= 0 and sp[1] < x.month then put(S.qh, '$w', string.format('%d,%d', sp[1], sp[2])) end
    S.spent = {x.month, x.spent + x.moverage * price}
    put(S.qh, '$', string.format('%d,%d', x.month, S.spent[2]))
  end
  if x.qfresh then
    if x.qold then put(S.qh, m .. '|w', x.qold) end
    S.kqx = x.mnext + (x.pp and PREPAID_KEEP_US or HOUR_US)
  end
end

-- count_pending counts the hour's pending counters: the overage, a
-- refusal (degraded or not), a shadow refusal; not a replay of a tenant
-- without state. A tenant with state keeps them in its hash ("p" before
-- them), one without in the pending hash.
local function count_pending(x, counted)
  local S = x.S
  if x.ok and x.overage + x.moverage == 0 and not x.shadowed then return end
  if x.meter == '' or not S.held and x.ok and x.replay then return end
  local pre = fmt(idiv(x.now, HOUR_US) * 3600) .. '|' .. x.meter .. '|'
  local b = S.ph
  if S.held then b, pre = S.th, 'p' .. pre end
  if counted and x.overage > 0 then add(b, pre .. 'o', x.overage) end
  if counted and x.moverage > 0 then add(b, pre .. 'm', x.moverage) end
  if not x.ok then add(b, pre .. (x.mask % 64 >= 32 and 'd' or 'x'), 1) end
  if x.shadowed then add(b, pre .. 's', 1) end
end

-- dirty writes the decision's counters into the state, which needs to
-- live until need: the fields in the order one admission's HSET writes
-- them (a group leaves the hash's layout as its requests alone would),
-- the expiry past need by a day (PEXPIREAT about once a day; a state new
-- to the hash lives until it is empty again).
local function dirty(x, need, usage)
  local S, th = x.S, x.S.th
  if th.t == nil then
    local n = #th
    th[n + 1], th[n + 2], th[n + 3] = 't', 'q', 'c'
  end
  th.t, th.q, th.c = true, true, true
  if x.w then put(S.th, 'w', x.w) end
  if x.relim then S.L = x.l.sig; put(S.th, 'L', S.L) end
  if usage then put(S.th, x.pk, usage) end
  if x.rolled and S.held and x.gn > 0 then S.dropg, x.gn = true, 0 end
  if not S.held then
    need = math.max(need, x.now + HOUR_US, x.g, x.b, x.dnext + HOUR_US, x.mnext + HOUR_US)
  end
  if need > x.xp then x.xp = -idiv(-(need + DAY_US), HOUR_US) * HOUR_US end
  S.held, S.g, S.b, S.d, S.du, S.dg, S.m, S.mu, S.mg, S.mo, S.gn, S.x, S.mn =
    true, x.g, x.b, x.d, x.du, x.dg, x.m, x.mu, x.mg, x.mo, x.gn, x.xp, x.mn
end

-- commit writes an admission (mode admit) into the state: the burst
-- limits' times (a refusal keeps a clamp), the quotas, the meter, the
-- credit's draws, the hour's pending usage; the counters only when
-- something of them changed.
local function commit(x)
  local S, cost = x.S, x.cost
  local counted = x.ok and not x.replay
  local need, changed, mprice, has_meter = 0, false, 0, false
  local r, b = x.rate, x.bucket
  if r and (x.ok or r.clamped) then
    x.g = x.ok and r.next or r.start
    need, changed = x.g, true
  end
  if b and (x.ok or b.clamped) then
    x.b = x.ok and b.next or b.start
    if x.b > need then need = x.b end
    changed = true
  end
  for i = 1, x.nclaims do
    local e = x.claims[i]
    if e.meter then
      has_meter = true
      if e.monthly then mprice = e.price end
    elseif counted and e.monthly then
      x.mu, x.mo, changed = x.mu + cost, x.mo + x.overage, true
      if x.mnext + HOUR_US > need then need = x.mnext + HOUR_US end
    elseif counted then
      x.du, changed = x.du + cost, true
      if x.dnext + HOUR_US > need then need = x.dnext + HOUR_US end
    end
  end
  if counted and has_meter then commit_meter(x, mprice) end
  if counted and x.credit and x.billed > 0 then
    local d = x.draws
    S.draws = {d[1], d[2] + x.billed, d[3], d[4]}
    put(S.qh, 'P', string.format('%d,%d,%d,%d', d[1], d[2] + x.billed, d[3], d[4]))
    if x.pfresh then S.kqx = x.mnext + PREPAID_KEEP_US end
  end
  local usage
  if counted and x.meter ~= '' then
    local n, u = 0, 0
    if S.usage[x.pk] then n, u = string.match(S.usage[x.pk], '^(%-?%d+),(%-?%d+)$') end
    usage = num(n + cost) .. ',' .. num(u + 1)
    S.usage[x.pk] = usage
    if x.now + PENDING_US > need then need = x.now + PENDING_US end
    changed = true
  end
  if changed then dirty(x, need, usage) end
  count_pending(x, counted)
end

-- answer is the decision's answer: for a replay the stored one with the
-- burst limits' and the meter's items of now; a first admission with a
-- key leaves its record.
local function answer(x, res)
  local q = x.q
  if x.ok and x.replay then
    local out = {}
    for i = 1, 31 do out[i] = x.replay[i] or 0 end
    for i = 7, 14 do out[i] = res[i] end
    for i = 23, 30 do out[i] = res[i] or 0 end
    out[5], out[6] = x.now, 1
    if x.precs then policies_report(out, x.precs, true) end
    return out
  end
  if x.ok and x.mode == 'admit' and x.idem then
    local enc = {}
    for i = 1, 22 do enc[i] = fmt(res[i]) end
    local lease = q.A[A.lease] + 0
    redis.call('DEL', x.idem)
    redis.call('HSET', x.idem, 'fp', q.A[A.fingerprint], 'st', lease > 0 and 'run' or 'done',
      'dec', table.concat(enc, ','), 'lease', fmt(x.now + lease), 'at', fmt(x.now))
    redis.call('PEXPIREAT', x.idem, pxat(x.now + IDEM_US))
  end
  if x.precs then policies_report(res, x.precs, x.ok and x.mode ~= 'peek') end
  return res
end

-- decide decides one request q on the state S: the interpreter's loop
-- over the list, then the policies, the report, the commit.
local function decide(q)
  local x = decision(q)
  local Aq = q.A
  SHIFT = q.shift
  if x.mode == 'admit' and #q.K - Aq[A.policies] >= KY.idem then x.idem = q.K[KY.idem] end
  if x.idem then
    local code = idem_check(x)
    if code then
      local r = {0, 0, 0, 0, x.now, code}
      for i = 7, 31 do r[i] = 0 end
      return r
    end
  end
  local cal = Aq[A.calendar]
  if not periods(x, cal ~= '' and cal) then return redis.error_reply('CALENDAR ' .. fmt(x.now)) end
  limit_change(x)
  if x.l.meter then meter_view(x) end
  if S.spent[1] == x.month then x.spent = S.spent[2] end
  if Aq[A.prepaid] ~= '' then
    local p = ints(Aq[A.prepaid])
    x.pp = {bal = p[1], id = p[2], prev = p[3], lines = p[4], exp = p[5]}
  end
  local es = x.l.entries
  for i = 1, #es do
    local err = KIND[es[i].k](x, es[i])
    if err then return redis.error_reply(err) end
  end
  if Aq[A.policies] ~= '0' or Aq[A.outside] ~= '' then policies(x) end
  local res = report(x)
  if x.mode == 'admit' then
    if x.ok and x.precs then policies_commit(x.precs, x.now, x.replay) end
    commit(x)
  end
  return answer(x, res)
end

-- state_write writes what the decisions changed, each hash's fields in
-- the order they were first written: the tenant's hash (t, q, c from the
-- state; its expiry when it moved), the pending hash, the meter hash.
local function state_write()
  if S.dropg then
    local h = redis.call('HGETALL', S.ks)
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 2) == 'g:' then redis.call('HDEL', S.ks, h[i]) end
    end
  end
  local th, held = S.th, S.t0
  if th.t and held and S.g == held[1] and S.b == held[2] and S.d == held[3] then
    th.t = false -- (as the hash holds it: not written again)
  elseif th.t then
    local day0 = S.d * DAY_US
    local g, b = '', ''
    if S.g ~= 0 then g = num(S.g - day0) end
    if S.b ~= 0 then b = num(S.b - day0) end
    th.t = g .. ',' .. b
  end
  if th.q and held and S.d == held[3] and S.dg == held.dg and S.m == held.m and S.mg == held.mg
      and S.mo == held.mo and S.gn == held.gn then
    th.q = held.ds .. ',' .. num(S.du) .. ',' .. held.dgs .. ',' .. held.ms .. ',' .. num(S.mu) .. ',' .. held.tail
  elseif th.q then
    th.q = string.format('%d,%d,%d,%d,%d,%d,%d,%d', S.d, S.du, S.dg, S.m, S.mu, S.mg, S.mo, S.gn)
  end
  if th.q then
    th.c = false
    if not held or S.x ~= S.x0 or S.mn ~= held[4] then
      th.c = string.format('%d,%d', -idiv(-S.x, HOUR_US), idiv(S.mn, DAY_US))
    end
  end
  if #th > 0 then
    local expiry = th.q and S.x ~= S.x0
    flush(S.ks, th)
    if expiry then redis.call('PEXPIREAT', S.ks, pxat(S.x)) end
  end
  if #S.ph > 0 then
    if flush(S.kp, S.ph) then redis.call('PEXPIRE', S.kp, PENDING_MS) end
  end
  if #S.qh > 0 then
    flush(S.kq, S.qh)
  end
  if S.kqx then redis.call('PEXPIREAT', S.kq, pxat(S.kqx)) end
end

-- prepare reads what a request's state read needs: its time (and the
-- shift of its expiries; real is Redis TIME), its list, its hour's pending
-- usage field.
-- (the last pending usage field named: its hour, meter and name; a
-- tenant's requests name the same one for an hour)
local PK_HOUR, PK_METER, PK = false, false, false

local function prepare(q, real)
  q.now, q.shift = time_at(q.A[A.now] + 0, real)
  q.l = list_of(q.A[A.list])
  if q.A[A.mode] == 'admit' then
    local hour, meter = idiv(q.now, HOUR_US), q.A[A.meter]
    if hour ~= PK_HOUR or meter ~= PK_METER then
      PK_HOUR, PK_METER, PK = hour, meter, 'p' .. hour .. '|' .. meter .. '|'
    end
    q.pk = PK
  end
end

-- failed is the answer of a request that raised err: its error reply.
local function failed(err)
  if type(err) == 'table' then return err end
  return redis.error_reply(tostring(err))
end

admit_run = function(reqs, isolate)
  RES = false
  local live, out, real = {}, {}, redis_time()
  for _, q in ipairs(reqs) do
    if isolate then
      local ok, err = pcall(prepare, q, real)
      if not ok then q.err = failed(err) end
    else
      prepare(q, real)
    end
    if not q.err then live[#live + 1] = q end
  end
  if #live > 0 then state_read(live) end
  for i, q in ipairs(reqs) do
    if q.err then
      out[i] = q.err
    elseif isolate then
      local ok, r = pcall(decide, q)
      out[i] = ok and r or failed(r)
    else
      out[i] = decide(q)
    end
  end
  if #live > 0 then state_write() end
  return out
end

-- (admit's request and its group of one, made once)
local Q = {K = false, A = false, now = 0, shift = 0, l = false, pk = false}
local ONE = {Q}

function FN.admit()
  Q.K, Q.A, Q.pk, RES = KEYS, ARGV, false, ANSWER
  prepare(Q, redis_time())
  state_read(ONE)
  local res = decide(Q)
  state_write()
  return res
end
end
