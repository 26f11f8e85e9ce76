--[[ admit.lua: one admission decision for one tenant and one request: the
library's function admit (lua/embed.go).

It checks GCRA (requests), the token bucket (cost units), the daily quota and
the monthly quota together and commits all of them or none: every active limit
is checked first, and state is written only when all of them pass. A refused
request changes no limit state; it only counts a refusal in the pending usage.
internal/ratelimit runs it; internal/ratelimit/model.go is its pure-Go
reference, and the tests hold the two to identical answers. Needs Redis 7.0
or later (Redis Functions; TIME before writes relies on effects
replication).

Units, epoch, precision
  Times are integer microseconds since the Unix epoch, UTC. Time is Redis
  TIME (sec*1e6 + usec) unless ARGV[1] gives an explicit time (tests only).
  Every quantity is an integer held in a Lua double, exact below 2^53: the
  Go side bounds limits by quota.MaxQuantity and every window (B*T, C*U) by
  2^50 us (~35 years), and now is ~2^50.6 us today, so sums stay below 2^53.
  Integer division is idiv (floor, corrected to be exact). Numbers written to
  Redis go through string.format('%d'), never tostring (which would print
  large numbers as 1e+15); only a count of hours, far below 1e14, is joined
  by '..'.

The state's keys, layout and the shared functions (clock, calendar,
load_state, save_state) are lua/state.lua's, earlier in the library. The
common case (the state in the hash, no new day or month) is read and
written here, on locals, with the fields that did not change left as they
are; anything else goes through load_state and save_state.

KEYS (the Go side builds them; every key carries the hash tag {t:<tenant id>},
so one call touches one Redis Cluster slot)
  KEYS[1] the state hash (state.lua)
  KEYS[2] <prefix>:v1:{t:<id>}:pending hash (state.lua): the pending usage
                                       of a tenant whose hash holds no state:
                                       "<hour start, unix s>|<meter>|x"
                                       refused requests, "|d", "|s"
  KEYS[3] <prefix>:v1:{t:<id>}:idem2:<sha256 hex of the idempotency key>
                                       hash (optional key): fp (request
                                       fingerprint), st ('run' while the first
                                       request is in flight, 'done' once its
                                       answer is stored), dec (the encoded
                                       first decision), lease (us: a 'run'
                                       record older than this is abandoned),
                                       at (us: the first decision's time);
                                       status/hdr/body are written by
                                       idem.lua when the answer is stored

ARGV
  [1]  now_us      explicit time in us; 0 = Redis TIME
  [2]  mode        'admit' | 'dry' (decide, write nothing) | 'peek' (report
                   the current room without any request; the Go side passes
                   cost 1 and overage 'block')
  [3]  cost        cost units, 1..2^40
  [4]  meter       the route's meter, for pending usage fields
  [5]  overage     'block' | 'bill'
  [6]  gcra_T      GCRA emission interval T in us (0 = unlimited)
  [7]  gcra_B      GCRA burst B, requests
  [8]  bucket_U    token bucket interval U per unit in us (0 = unlimited)
  [9]  bucket_C    token bucket capacity C, units
  [10] daily       daily quota, units (-1 = unlimited)
  [11] monthly     monthly quota, units (-1 = unlimited)
  [12] fp          request fingerprint (with KEYS[3]): method, path, body
  [13] lease_us    how long a first request may stay in flight, us; 0 =
                   the record is 'done' at once (no answer to store)
  [14] ocap        the spend cap: overage units the month may hold at most
                   (-1 = no cap; quota.SpendCapUnits; only with 'bill')
  [15] np          policies decided with the tenant's limits (absent or 0:
                   none)
  [16] id          the request's id (concurrency leases, log entries)
  [17] outside     what the policies of other slots (reserved before this
                   call: ratelimit/policy.go) made of the request: '' none
                   refused, or letters: 'x' an enforced one refused (the
                   request is refused: mask 16), 'd' a degrade one refused
                   (degraded, when nothing else refuses), 's' a shadow one
                   refused; counted here, in the same pending fields
  [18] mq          the meter quota of the request's meter (see "Meter
                   quotas"): '' none, or "dq,mq,bill,price,tprice,capm":
                   the meter's daily and monthly quotas (-1 = unlimited),
                   1 when its overage is billed, its price per 1,000
                   units, the tier's (0 unless the tier bills), and the
                   spend cap in millicents (-1 = none: with this argument
                   the cap is checked in millicents, never ocap's units,
                   so Go sends the tier's cap whenever it sends a meter's
                   quota); its key is the LAST of KEYS. A tier with a
                   spend cap that bills overage, or has a billed meter
                   quota, passes it on every request, "-1,-1,0,0,..."
                   for a meter without a quota, so that the cap sees the
                   meters' overage of the month, whatever plan billed it. A prepaid tenant's has five more,
                   ",bal,bid,prev,lines,pexp" (see "Prepaid"), and is passed on
                   every request
  [19] cal         the tenant's billing calendar (see "Calendars"): '' the
                   default one (UTC days and calendar months), or
                   quota.Calendar.Boundaries of Go's now (calendar.lua)
  [20..]           np groups of policy.lua's POLICY_ARGS; their keys are
                   the last np KEYS before the meter quota's (after the
                   idempotency key, if any), all under the tenant's hash tag
  ([15..19] are all absent, or all present: a call without policies takes
  them when the meter has a quota or the tenant a calendar; the KEYS do
  not change with a calendar)

Return: an error reply "CALENDAR <now us>" when ARGV[19]'s days do not
reach the script's now (see "Calendars"), or "PREPAID <now us>" when the
balance of ARGV[18] is of another period than now's (see "Prepaid"),
written nothing; else a flat
array of 22 integers, then 9 of the meter quota (when
ARGV[18] names one), then policy.lua's POLICY_ITEM integers per policy
(none when np is 0; idempotency codes 2, 3 return the 22 alone)
  [1] allowed (1/0)
  [2] violated bitmask: 1 burst, 2 bucket, 4 daily, 8 monthly, 16 a policy
      (its item says which), 32 degraded: only a degrade policy refused (the
      request gets its fallback answer; nothing is consumed), 64 spend cap,
      128 the meter's daily quota, 256 the meter's monthly quota, 512 a
      prepaid tenant's credit does not cover the request (retry -1)
  [3] retry after, us (0 when allowed; -1 = never: the cost exceeds a limit's
      whole size)
  [4] overage units admitted past the monthly quota (bill)
  [5] now, us
  [6] idempotency: 0 = a first attempt (or no key), 1 = replayed (the
      stored answer to an earlier request with the key), 2 = in flight (the
      first request with the key has not answered yet), 3 = mismatch (the
      key was used for a different request); 2 and 3 decide nothing and
      report no limits (all zero)
  then for burst, bucket, daily, monthly (in this order) four integers:
      active (1/0), limit, remaining, reset (absolute us)
  [23..30] with a meter quota, the same four for the meter's daily and
      monthly quotas, and [31] the meter overage units admitted (past the
      meter's billed monthly quota; not among [4]), which a refund or a
      settlement gives back
  After an admission, remaining and reset describe the state after it; after
  a refusal, in dry-run refusals and in peek, the state as it is.

Limit changes: fresh or clamp
  GCRA and the bucket keep their state as a time (TAT, FULL), and the
  hash's field L = "T,B,U,C" (ARGV[6..9] as sent) names the limits it was
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
  Spend cap ('bill' with ocap >= 0): a request whose overage would bring
  the month's overage units past ocap is refused (mask 64), consuming
  nothing; retry = next month start - now, or -1 when cost > quota + ocap
  (it would pass the cap even in a fresh month, which has no grant).

Calendars (ARGV[19] not '')
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
  the UTC path of before, at no cost but the test of ARGV[19].

Policies (np > 0)
  Decided with the tier's limits, all or nothing: policies_check (policy.lua)
  reads each one's key after the tier's checks; a refusing enforced policy
  (reject, queue) refuses the request (mask 16); a refusing degrade policy,
  when everything else admits, makes it degraded (mask 32): not admitted,
  nothing consumed, counted as degraded; a refusing shadow policy refuses
  nothing and is counted as a shadow refusal. An admitted request commits
  every policy that admitted it, in the same call. Peek and dry runs check
  and write nothing. Pending fields: "|d" degraded, "|s" shadow refusals.

Meter quotas (ARGV[18] not '')
  A tier's quota of one meter (quota.MeterQuota), beside the tier-wide
  ones and decided with them, all or nothing. Its state is one field of
  the hash <prefix>:v1:{t:<id>}:mq (the last of KEYS), named by the meter:
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
  only (taken off the tier's, so no unit is billed twice). With a spend cap
  and meter overage, the cap is checked in millicents over both: (tier
  overage units) * tprice + mc + (meter overage) * price <= capm (exact:
  each term is below 2^53 until the sum is past capm <= 2^50, and a double
  past 2^53 still compares greater). The hash lives to the end of the
  month of its last write + 1 h (PEXPIREAT when a field's month changes).
  Replays answer the meter items as they are now.

Prepaid (ARGV[18] ends in ",bal,bid,prev,lines,pexp")
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

Idempotency (KEYS[3] present, mode 'admit')
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

do
local IDEM_US = DAY_US
local PENDING_US = 14 * DAY_US
local PENDING_MS = 14 * 86400 * 1000
local PREPAID_KEEP_US = 40 * DAY_US

-- (The body is not indented: it was the script's chunk.)
function FN.admit()
local call = redis.call
KS = KEYS[1]
local now = clock(ARGV[1] + 0)

local mode = ARGV[2]
-- (the Go side sends decimal integers: arithmetic converts each once, where
-- tonumber, a function call, would convert twice)
local cost = ARGV[3] + 0
local meter = ARGV[4]
local bill = ARGV[5] == 'bill'
local gT, gB = ARGV[6] + 0, ARGV[7] + 0
local bU, bC = ARGV[8] + 0, ARGV[9] + 0
local dq, mq = ARGV[10] + 0, ARGV[11] + 0
local fp, lease = ARGV[12], ARGV[13] + 0
local ocap = ARGV[14] + 0
local KP, idem = KEYS[2], KEYS[3]
local np = 0
-- mqs: the meter quota's ARGV[18] (nil or ''); its key is the last of KEYS
local mqs, nq = ARGV[18], 0
if mqs == '' then mqs = nil end
if mqs then nq = 1 end
if ARGV[15] then
  np = ARGV[15] + 0
  -- the idempotency key is KEYS[3] only when the policies' keys leave it
  if #KEYS - np - nq < 3 then idem = nil end
end

-- replay holds the stored decision of a finished first request.
local replay
if mode == 'admit' and idem then
  local h = redis.call('HMGET', idem, 'fp', 'st', 'dec', 'lease', 'at')
  if h[1] and tonumber(h[5]) + IDEM_US > now then
    local code = 0
    if h[1] ~= fp then
      code = 3
    elseif h[2] == 'run' and tonumber(h[4]) > now then
      code = 2
    end
    if code > 0 then
      local r = {0, 0, 0, 0, now, code}
      for i = 1, 16 do r[#r + 1] = 0 end
      return r
    end
    if h[2] == 'done' then
      replay = {}
      for v in string.gmatch(h[3], '[^,]+') do
        replay[#replay + 1] = tonumber(v)
      end
    end
  end
end

-- The state, as locals (a table costs on every call). The hash is read
-- here, with the hour's pending field (no state: load_state's empty one).
-- The raw strings of the hash's fields are kept: a field an admission does
-- not change is not formatted again (see "commit").
local hour = idiv(now, HOUR_US)
-- the hour's "units,requests" field of the hash (state.lua); an hour
-- count is far below 1e14, where '..' prints an integer exactly
local pk = 'p' .. hour .. '|' .. meter .. '|'
-- lim: the burst limits the state was written under (field L; see "Limit
-- changes")
local h, lim
if mode == 'admit' then
  h = call('HMGET', KS, 't', 'q', 'c', pk, 'L')
  lim = h[5]
else
  h = call('HMGET', KS, 't', 'q', 'c', 'L')
  lim, h[4] = h[4], false
end
local held = h[1] and true or false
local g, b, d, du, dg, m, mu, mg, mo, gn, x, mn
local ds, dgs, ms, qtail, mns, pend -- raw fields of the hash
if held then
  local gs, bs, dus, mus, xs
  gs, bs = string.match(h[1], '^(%-?%d*),(%-?%d*)$')
  -- (one match: the tail is a capture holding the last three's captures)
  local mgs, mos, gns
  ds, dus, dgs, ms, mus, qtail, mgs, mos, gns = string.match(h[2],
    '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),((%-?%d+),(%-?%d+),(%-?%d+))$')
  xs, mns = string.match(h[3], '^(%-?%d+),(%-?%d+)$')
  -- (decimal integers: arithmetic converts each once; tonumber, a function
  -- call, twice)
  d = ds + 0
  local day0 = d * DAY_US
  if gs ~= '' then g = gs + day0 else g = 0 end
  if bs ~= '' then b = bs + day0 else b = 0 end
  du, dg, m, mu, mg, mo, gn = dus + 0, dgs + 0, ms + 0, mus + 0, mgs + 0, mos + 0, gns + 0
  x, mn = xs * HOUR_US, mns * DAY_US
  pend = h[4]
else
  local s = load_state(pk, h)
  g, b, d, du, dg, m, mu, mg, mo, gn, x, mn =
    s.g, s.b, s.d, s.du, s.dg, s.m, s.mu, s.mg, s.mo, s.gn, s.x, s.mn
end

-- quota periods (day_of and month_of of state.lua, on the locals): a past
-- period's counters reset (the reset is written only with an admission);
-- moved is set when the calendar changed the state's day or month bounds,
-- which then is written in full by save_state.
-- cal: the tenant's billing calendar (ARGV[19]; see "Calendars"), nil for
-- the default one, whose path below is the one of before calendars.
local cal = ARGV[19]
if cal == '' then cal = nil end
local day, dnext, month, mnext
-- mprev: the month that ends, kept as the month before (state.lua's field w)
local moved, rolled, mprev = false, false, nil
if cal then
  local _
  day, _, dnext, month, _, mnext = cal_at(cal, now)
  if not day then
    -- Go's clock and Redis's too far apart: Go retries with this now
    return redis.error_reply('CALENDAR ' .. fmt(now))
  end
  if day ~= d then
    d, du, dg, moved = day, 0, 0, true
  end
  if month ~= m then
    -- (state.lua's month_roll, on the locals)
    if m >= 0 and m < month then mprev = month_pack(m, mu, mg, mo) end
    m, mu, mg, mo, rolled, moved = month, 0, 0, 0, true, true
  end
  -- the stored mn is the default calendar's fast path: a calendar's state
  -- keeps 0 there (state.lua's packed), so that a return to the default
  -- calendar computes its month again
  if mn ~= 0 then moved = true end
  mn = mnext
else
  day = idiv(now, DAY_US)
  dnext = (day + 1) * DAY_US
  if day ~= d then
    d, du, dg, moved = day, 0, 0, true
  end
  -- (a month is at most 31 days: a clock set back past the month's start
  -- is caught unless it moved less than that)
  if now < mn and now >= mn - 31 * DAY_US and m >= 0 then
    month, mnext = m, mn
  else
    local _
    month, _, mnext = month_at(now)
    if month ~= m then
      if m >= 0 and m < month then mprev = month_pack(m, mu, mg, mo) end
      m, mu, mg, mo, rolled = month, 0, 0, 0, true
    end
    mn, moved = mnext, true
  end
end

-- limit changes (see "Limit changes"): sig names this call's burst
-- limits; a state written under others starts fresh in each limit at
-- least as large in rate and burst, and is clamped in the others
local sig, relim
if gT > 0 or bU > 0 then
  sig = ARGV[6] .. ',' .. ARGV[7] .. ',' .. ARGV[8] .. ',' .. ARGV[9]
  if lim ~= sig then
    relim = true
    local lT, lB, lU, lC = string.match(lim or '', '^(%d+),(%d+),(%d+),(%d+)$')
    if lT then
      lT, lB, lU, lC = lT + 0, lB + 0, lU + 0, lC + 0
      if gT > 0 and lT > 0 and gT <= lT and gB >= lB then g = 0 end
      if bU > 0 and lU > 0 and bU <= lU and bC >= lC then b = 0 end
    end
  end
end

local ok, mask, retry = true, 0, 0
-- (refusals inline, without a function call each) a refusal adds its bit
-- and keeps the longest wait; -1 (never) wins over any.

-- GCRA
local gtat, gnew, gclamp
if gT > 0 then
  gtat = g
  if gtat < now then gtat = now end
  if gtat > now + gB * gT then gtat, gclamp = now + gB * gT, true end
  gnew = gtat + gT
  if gnew - now > gB * gT then
    local wait = gnew - gB * gT - now
    ok, mask = false, mask + 1
    if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
  end
end

-- token bucket
local bf, bnew, bclamp
if bU > 0 then
  bf = b
  if bf < now then bf = now end
  if bf > now + bC * bU then bf, bclamp = now + bC * bU, true end
  local wait
  if cost > bC then
    wait = -1
  else
    bnew = bf + cost * bU
    if bnew - now > bC * bU then wait = bnew - bC * bU - now end
  end
  if wait then
    ok, mask = false, mask + 2
    if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
  end
end

-- quotas
local dused, dgrant = du, dg
if dq >= 0 and not replay and dused + cost > dq + dgrant then
  local wait = dnext - now
  if cost > dq then wait = -1 end
  ok, mask = false, mask + 4
  if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
end

local mused, mgrant, mover = mu, mg, mo
local overage = 0
if mq >= 0 and not replay then
  local limit = mq + mgrant
  if mused + cost > limit then
    if bill then
      overage = math.min(cost, mused + cost - limit)
      if ocap >= 0 and not mqs and mover + overage > ocap then
        local wait = mnext - now
        if cost > mq + ocap then wait = -1 end
        ok, mask = false, mask + 64
        if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
      end
    else
      local wait = mnext - now
      if cost > mq then wait = -1 end
      ok, mask = false, mask + 8
      if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
    end
  end
end
-- the meter quota (see "Meter quotas")
local KQ, qrow, qdq, qmq, qprice, qP, qcap
local qd, qdu, qm, qmu, qmo, qmc, qfresh, qw, qdw
local qover = 0
-- prepaid (see "Prepaid"): pbal nil for postpaid
local pbal, pbid, pprev, plines, pexp, pm, pmc, ppm, ppmc, pfresh
local padd = 0
if mqs then
  KQ = KEYS[#KEYS]
  local a1, a2, a3, a4, a5, a6, a7 = string.match(mqs, '^(%-?%d+),(%-?%d+),([01]),(%d+),(%d+),(%-?%d+)(.*)$')
  qdq, qmq, qprice, qP, qcap = a1 + 0, a2 + 0, a4 + 0, a5 + 0, a6 + 0
  if a3 == '0' then qprice = -1 end -- not billed
  if a7 ~= '' then
    local b1, b2, b3, b4, b5 = string.match(a7, '^,(%-?%d+),(%d+),(%d+),(%d+),(%d+)$')
    pbal, pbid, pprev, plines, pexp = b1 + 0, b2 + 0, b3 + 0, b4 + 0, b5 + 0
    if pbid ~= month then
      -- Go's balance is of another period: it reads now's and calls again
      return redis.error_reply('PREPAID ' .. fmt(now))
    end
    qrow = call('HMGET', KQ, meter, '$', 'P')
  else
    qrow = call('HMGET', KQ, meter, '$')
  end
  qd, qdu, qm, qmu, qmo, qmc = -1, 0, -1, 0, 0, 0
  if qrow[1] then
    local s1, s2, s3, s4, s5 = string.match(qrow[1], '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
    qd, qdu, qm, qmu, qmo = s1 + 0, s2 + 0, s3 + 0, s4 + 0, s5 + 0
  end
  if qrow[2] then
    local s1, s2 = string.match(qrow[2], '^(%-?%d+),(%-?%d+)$')
    if s1 + 0 == month then
      qmc = s2 + 0
    elseif s1 + 0 < month then
      qdw = qrow[2] -- an earlier month's: kept as '$w' when '$' moves on
    end
  end
  if qd ~= day then qd, qdu = day, 0 end
  qfresh = qm ~= month -- the field's month changes: its expiry too
  if qfresh then
    -- an earlier month's counters: kept as "<meter>|w" (meterq.lua)
    if qm >= 0 and qm < month then qw = string.format('%d,%d,%d', qm, qmu, qmo) end
    qm, qmu, qmo = month, 0, 0
  end
  if qdq >= 0 and not replay and qdu + cost > qdq then
    local wait = dnext - now
    if cost > qdq then wait = -1 end
    ok, mask = false, mask + 128
    if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
  end
  if qmq >= 0 and not replay and qmu + cost > qmq then
    if qprice >= 0 then
      qover = math.min(cost, qmu + cost - qmq)
    else
      local wait = mnext - now
      if cost > qmq then wait = -1 end
      ok, mask = false, mask + 256
      if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
    end
  end
  -- a unit past both monthly quotas is the meter's overage only
  if qover > 0 then overage = overage - math.min(overage, qover) end
  if qcap >= 0 and (overage > 0 or qover > 0)
      and (mover + overage) * qP + qmc + qover * qprice > qcap then
    -- never: the cost alone passes the cap in a fresh month (no grant)
    local wait = mnext - now
    local ft, fq = 0, 0
    if qprice >= 0 and qmq >= 0 then fq = math.max(0, cost - qmq) end
    if bill and mq >= 0 then ft = math.max(0, cost - mq) end
    ft = ft - math.min(ft, fq)
    if ft * qP + fq * qprice > qcap then wait = -1 end
    ok, mask = false, mask + 64
    if retry ~= -1 and (wait < 0 or wait > retry) then retry = wait end
  end
  if pbal then
    pm, pmc, ppm, ppmc = -1, 0, -1, 0
    if qrow[3] then
      local s1, s2, s3, s4 = string.match(qrow[3], '^(%-?%d+),(%-?%d+),(%-?%d+),(%-?%d+)$')
      pm, pmc, ppm, ppmc = s1 + 0, s2 + 0, s3 + 0, s4 + 0
    end
    -- a period's first draw: the tier's overage already admitted in it
    -- (a tenant moved onto a prepaid tier mid-period) is drawn too, at
    -- its price now, as its invoice will rate it
    pfresh = pm ~= month
    if pfresh then pm, pmc, ppm, ppmc = month, mover * qP, pm, pmc end
    local held = pmc + 999 * (plines - 1)
    if pprev ~= 0 and ppm == pprev and ppmc > 0 then
      held = held + math.max(0, ppmc + 999 * plines - pexp)
    end
    padd = overage * qP
    if qover > 0 then padd = padd + qover * qprice end
    if padd > 0 and not replay and held + padd > pbal then
      ok, mask, retry = false, mask + 512, -1
    end
  end
end

-- policies (see "Policies"): precs holds what commit and report need
local precs, degraded, shadowed = nil, false, false
if np > 0 or (ARGV[17] and ARGV[17] ~= '') then
  local pass, degr, pretry
  pass, degr, pretry, precs = policies_check(#KEYS - np - nq + 1, 20, np, now, ARGV[16])
  local outside = ARGV[17]
  if string.find(outside, 'x', 1, true) then pass = false end
  if string.find(outside, 'd', 1, true) then degr = true end
  if string.find(outside, 's', 1, true) then shadowed = true end
  if not pass then
    ok, mask = false, mask + 16
    if retry ~= -1 and (pretry < 0 or pretry > retry) then retry = pretry end
  elseif degr and ok then
    ok, mask, degraded = false, mask + 32, true
  end
  for _, r in ipairs(precs) do
    if r.outcome == 2 then shadowed = true end
  end
end

if not ok or mode == 'peek' then overage, qover = 0, 0 end

-- commit: only when every limit passed, only in admit mode
if mode == 'admit' then
  -- wg, wb, wd, wm: the parts written (g and b are the field t, the day and
  -- month the field q)
  local need, wg, wb, wd, wm = 0, false, false, false, false
  if ok then
    if gT > 0 then g, need, wg = gnew, gnew, true end
    if bU > 0 then
      b, wb = bnew, true
      if bnew > need then need = bnew end
    end
    if dq >= 0 and not replay then
      du, wd = dused + cost, true
      if dnext + HOUR_US > need then need = dnext + HOUR_US end
    end
    if mq >= 0 and not replay then
      mu, mo, wm = mused + cost, mover + overage, true
      if mnext + HOUR_US > need then need = mnext + HOUR_US end
    end
  else
    -- keep a clamp (see "Limit changes"): it consumes nothing
    if gclamp then g, need, wg = gtat, gtat, true end
    if bclamp then
      b, wb = bf, true
      if bf > need then need = bf end
    end
  end
  if ok and precs then policies_commit(precs, now, replay) end
  if ok and mqs and not replay and (qdq >= 0 or qmq >= 0) then
    local f = string.format('%d,%d,%d,%d,%d', qd, qdu + cost, qm, qmu + cost, qmo + qover)
    if qover > 0 and qcap >= 0 then
      if qdw then
        call('HSET', KQ, meter, f, '$', string.format('%d,%d', month, qmc + qover * qprice), '$w', qdw)
      else
        call('HSET', KQ, meter, f, '$', string.format('%d,%d', month, qmc + qover * qprice))
      end
    else
      call('HSET', KQ, meter, f)
    end
    if qfresh then
      if qw then call('HSET', KQ, meter .. '|w', qw) end
      call('PEXPIREAT', KQ, pxat(mnext + (pbal and PREPAID_KEEP_US or HOUR_US)))
    end
  end
  if ok and padd > 0 and not replay then
    call('HSET', KQ, 'P', string.format('%d,%d,%d,%d', pm, pmc + padd, ppm, ppmc))
    if pfresh then call('PEXPIREAT', KQ, pxat(mnext + PREPAID_KEEP_US)) end
  end
  local dirty = wg or wb or wd or wm
  -- Pending usage: in the state hash, written by the same HSET.
  local extra = false
  if ok and not replay then
    local u, r = 0, 0
    if pend then
      local a, c = string.match(pend, '^(%-?%d+),(%-?%d+)$')
      u, r = a + 0, c + 0
    end
    pend = string.format('%d,%d', u + cost, r + 1)
    extra, dirty = true, true
    if now + PENDING_US > need then need = now + PENDING_US end
  end
  if dirty and held and not moved then
    -- The common case: one HSET of the fields that changed, each formatted
    -- as state.lua's packed would (the others are as they were).
    local was = x
    if need > x then
      -- (save_state's slack: PEXPIREAT about once a day)
      x = -idiv(-(need + DAY_US), HOUR_US) * HOUR_US
    end
    local t, q, c
    if wg or wb then
      local day0 = d * DAY_US
      if g ~= 0 and b ~= 0 then
        t = string.format('%d,%d', g - day0, b - day0)
      else
        local gs, bs = '', ''
        if g ~= 0 then gs = fmt(g - day0) end
        if b ~= 0 then bs = fmt(b - day0) end
        t = gs .. ',' .. bs
      end
    end
    if wd or wm then
      if mo == mover then
        -- d, dg, m, mg, mo and gn are as they were read
        q = ds .. ',' .. fmt(du) .. ',' .. dgs .. ',' .. ms .. ',' .. fmt(mu) .. ',' .. qtail
      else
        q = string.format('%d,%d,%d,%d,%d,%d,%d,%d', d, du, dg, m, mu, mg, mo, gn)
      end
    end
    if x ~= was then c = fmt(-idiv(-x, HOUR_US)) .. ',' .. mns end
    if t and q and extra and not c and not relim then
      call('HSET', KS, 't', t, 'q', q, pk, pend)
    else
      local args = {}
      if t then args[#args + 1] = 't'; args[#args + 1] = t end
      if q then args[#args + 1] = 'q'; args[#args + 1] = q end
      if c then args[#args + 1] = 'c'; args[#args + 1] = c end
      if extra then args[#args + 1] = pk; args[#args + 1] = pend end
      if relim then args[#args + 1] = 'L'; args[#args + 1] = sig end
      call('HSET', KS, unpack(args))
    end
    if c then call('PEXPIREAT', KS, pxat(x)) end
  elseif dirty then
    -- a new day or month, or a new state: state.lua's save_state
    local s = {held = held, rolled = rolled, x = x, g = g, b = b, d = d, du = du, dg = dg,
      m = m, mu = mu, mg = mg, mo = mo, mn = mn, gn = gn, dn = dnext, cal = cal, w = mprev}
    local xs = nil
    if extra then
      s[pk], xs = pend, {pk}
    end
    if relim then
      s.L, xs = sig, xs or {}
      xs[#xs + 1] = 'L'
    end
    save_state(s, need, xs, now)
    held = s.held
  end
  -- the pending hash's fields (with "p" before them in the state hash)
  if held then
    if ok and overage > 0 and not replay then
      call('HINCRBY', KS, 'p' .. fmt(hour * 3600) .. '|' .. meter .. '|o', overage)
    end
    if qover > 0 and not replay then
      call('HINCRBY', KS, 'p' .. fmt(hour * 3600) .. '|' .. meter .. '|m', qover)
    end
    if not ok then call('HINCRBY', KS, 'p' .. fmt(hour * 3600) .. '|' .. meter .. (degraded and '|d' or '|x'), 1) end
    if shadowed then call('HINCRBY', KS, 'p' .. fmt(hour * 3600) .. '|' .. meter .. '|s', 1) end
  elseif not (ok and replay) then
    -- a refusal of a tenant without state (an admission always writes the
    -- state): the pending hash, which has an expiry of its own
    local pf = fmt(hour * 3600) .. '|' .. meter .. '|'
    local fresh = call('HINCRBY', KP, pf .. (degraded and 'd' or 'x'), 1) == 1
    if shadowed then call('HINCRBY', KP, pf .. 's', 1) end
    -- A field that is new may be a hash that is new (the worker renamed the
    -- last one away): only then can it lack its expiry.
    if fresh then call('PEXPIRE', KP, PENDING_MS) end
  end
end

-- report: one table constructor of all 22 values (a table grown item by
-- item is rehashed as it grows)
local consumed = ok and mode ~= 'peek'
local ga, gl, gr, gz = 0, 0, 0, 0
if gT > 0 then
  local t = gtat
  if consumed then t = gnew end
  ga, gl, gr, gz = 1, gB, idiv(gB * gT - (t - now), gT), t
  if gr < 0 then gr = 0 end
end
local ba, bl, br, bz = 0, 0, 0, 0
if bU > 0 then
  local f = bf
  if consumed then f = bnew end
  ba, bl, br, bz = 1, bC, idiv(bC * bU - (f - now), bU), f
  if br < 0 then br = 0 end
end
local spent = 0
if consumed then spent = cost end
local da, dl, dr, dz = 0, 0, 0, 0
if dq >= 0 then
  da, dl, dr, dz = 1, dq + dgrant, dq + dgrant - dused - spent, dnext
  if dr < 0 then dr = 0 end
end
local ma, ml, mr, mz = 0, 0, 0, 0
if mq >= 0 then
  ma, ml, mr, mz = 1, mq + mgrant, mq + mgrant - mused - spent, mnext
  if mr < 0 then mr = 0 end
end
local res = {ok and 1 or 0, mask, ok and 0 or retry, overage, now, 0,
  ga, gl, gr, gz, ba, bl, br, bz, da, dl, dr, dz, ma, ml, mr, mz}
if mqs then
  local a, l, r, z = 0, 0, 0, 0
  if qdq >= 0 then
    a, l, r, z = 1, qdq, qdq - qdu - spent, dnext
    if r < 0 then r = 0 end
  end
  res[23], res[24], res[25], res[26] = a, l, r, z
  a, l, r, z = 0, 0, 0, 0
  if qmq >= 0 then
    a, l, r, z = 1, qmq, qmq - qmu - spent, mnext
    if r < 0 then r = 0 end
  end
  res[27], res[28], res[29], res[30], res[31] = a, l, r, z, qover
end

if ok and replay then
  -- the stored decision, with the burst and bucket items and the policies
  -- of now
  for i = 1, 8 do replay[6 + i] = res[6 + i] end
  replay[5], replay[6] = now, 1
  -- (the meter items as they are now, and no meter overage: stored
  -- answers hold 22 values)
  for i = 23, 31 do replay[i] = res[i] end
  if precs then policies_report(replay, precs, true) end
  return replay
end
if ok and mode == 'admit' and idem then
  local enc = {}
  for i = 1, 22 do
    enc[i] = fmt(res[i])
  end
  local st = 'done'
  if lease > 0 then st = 'run' end
  redis.call('DEL', idem)
  redis.call('HSET', idem, 'fp', fp, 'st', st, 'dec', table.concat(enc, ','),
    'lease', fmt(now + lease), 'at', fmt(now))
  redis.call('PEXPIREAT', idem, pxat(now + IDEM_US))
end
if precs then policies_report(res, precs, consumed) end
return res
end
end
