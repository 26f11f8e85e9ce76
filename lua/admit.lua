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
       policy; an error reply "CALENDAR <now>" (now outside the days Go
       sent: it sends those of this now) or "PREPAID <now>" (a balance of
       another period), having written nothing.

Masks: 1 burst, 2 bucket, 4 daily, 8 monthly, 16 a policy, 32 degraded, 64
the spend cap, 128 and 256 the meter's daily and monthly quotas, 512 credit.
Idempotency (mode admit with idem): a record younger than a day decides
first: another fingerprint is a mismatch (3), a record in flight (its lease
not past) is 2, both answered with no limits; a done record is replayed (1):
it passes the burst limits and the policies, counts no quota, and answers
the stored decision with the burst and meter items of now. Only an admitted
first request leaves a record.
State, periods and expiries are state.lua's layout, unchanged: see its
header, and internal/limits/state.go for each field.
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

local function ints(v)
  local s = {}
  for n in string.gmatch(v, '[^,]+') do s[#s + 1] = n + 0 end
  return s
end

-- A buffer holds a hash's writes until the end: fields set (set[f], the
-- value) and counters added to (incr[f]), in the order first written.
local function buffer() return {order = {}, set = {}, incr = {}} end

local function put(b, f, v)
  if b.set[f] == nil and b.incr[f] == nil then b.order[#b.order + 1] = f end
  b.set[f] = v
end

local function add(b, f, n)
  if b.set[f] == nil and b.incr[f] == nil then b.order[#b.order + 1] = f end
  b.incr[f] = (b.incr[f] or 0) + n
end

-- flush writes buffer b into the hash key; it reports whether a counter
-- was new (the hash may be new: its expiry is the caller's).
local function flush(key, b)
  local args, new = {}, false
  for _, f in ipairs(b.order) do
    if b.set[f] ~= nil then
      args[#args + 1], args[#args + 2] = f, b.set[f]
    else
      if #args > 0 then redis.call('HSET', key, unpack(args)) end
      args = {}
      new = redis.call('HINCRBY', key, f, b.incr[f]) == b.incr[f] or new
    end
  end
  if #args > 0 then redis.call('HSET', key, unpack(args)) end
  return new
end

-- state_read reads the tenant's hash (t, q, c, L and the pending usage
-- fields reqs count) and the meter hash's fields their lists use.
local function state_read(reqs)
  local K = reqs[1].K
  local S = {ks = K[KY.state], kp = K[KY.pending], kq = K[KY.meters], usage = {}, meters = {},
    th = buffer(), ph = buffer(), qh = buffer(), draws = {0, 0, 0, 0}, spent = {0, 0}}
  local f, mf = {'t', 'q', 'c', 'L'}, {}
  for _, q in ipairs(reqs) do
    if q.pk then f[#f + 1] = q.pk end
    local l = q.l
    if l.meter and not mf[l.meter] then mf[#mf + 1], mf[l.meter] = l.meter, true end
    for _, e in ipairs(l.entries) do
      if e.k == 'c' and not mf['$'] then mf[#mf + 1], mf['$'] = '$', true end
      if e.k == 'p' and not mf.P then mf[#mf + 1], mf.P = 'P', true end
    end
  end
  local h = redis.call('HMGET', S.ks, unpack(f))
  S.L = h[4] or nil
  for i = 5, #f do S.usage[f[i]] = h[i] or nil end
  local s = load_state(nil, h)
  S.held, S.x0 = s.held, s.x
  S.c = {g = s.g, b = s.b, d = s.d, du = s.du, dg = s.dg, m = s.m, mu = s.mu, mg = s.mg, mo = s.mo,
    gn = s.gn, x = s.x, mn = s.mn}
  if #mf == 0 then return S end
  h = redis.call('HMGET', S.kq, unpack(mf))
  for i, name in ipairs(mf) do
    if h[i] and name == '$' then S.spent = ints(h[i])
    elseif h[i] and name == 'P' then S.draws = ints(h[i])
    elseif h[i] then S.meters[name] = ints(h[i]) end
  end
  return S
end

-- view is the state's counters as a decision reads them (a copy).
local function view(S)
  local c, v = S.c, {}
  for k, n in pairs(c) do v[k] = n end
  if not S.held then
    v.g, v.b, v.d, v.du, v.dg, v.m, v.mu, v.mg, v.mo, v.gn, v.x, v.mn = 0, 0, -1, 0, 0, -1, 0, 0, 0, 0, 0, 0
  end
  return v
end

-- periods moves the view into now's day and month (a past period's
-- counters start from 0; a month that ends becomes the month before, w).
-- The default calendar trusts the cached month end within 31 days before
-- it; a calendar's ids come from Go's boundaries. False: now is outside
-- them.
local function periods(x, cal)
  local v, now = x.v, x.now
  local day, dnext, month, mnext, _
  if cal then
    day, _, dnext, month, _, mnext = cal_at(cal, now)
    if not day then return false end
  else
    day = idiv(now, DAY_US)
    dnext = (day + 1) * DAY_US
  end
  if day ~= v.d then v.d, v.du, v.dg = day, 0, 0 end
  if not cal and now < v.mn and now >= v.mn - 31 * DAY_US and v.m >= 0 then
    month, mnext = v.m, v.mn
  else
    if not cal then month, _, mnext = month_at(now) end
    if month ~= v.m then
      if v.m >= 0 and v.m < month then x.w = month_pack(v.m, v.mu, v.mg, v.mo) end
      v.m, v.mu, v.mg, v.mo, x.rolled = month, 0, 0, 0, true
    end
    v.mn = cal and 0 or mnext
  end
  x.day, x.dnext, x.month, x.mnext = day, dnext, month, mnext
  return true
end

-- limit_change: under other burst limits than the state's (L), each of
-- GCRA and the bucket at least as large in rate and burst starts fresh;
-- any other change keeps the state (the checks clamp it).
local function limit_change(x)
  local l, v = x.l, x.v
  if not l.sig or l.sig == x.S.L then return end
  x.relim = true
  local T, B, U, C = string.match(x.S.L or '', '^(%d+),(%d+),(%d+),(%d+)$')
  if not T then return end
  local r, b = l.rate, l.bucket
  if r and T + 0 > 0 and r.T <= T + 0 and r.B >= B + 0 then v.g = 0 end
  if b and U + 0 > 0 and b.T <= U + 0 and b.B >= C + 0 then v.b = 0 end
end

-- meter_view is the list's meter's counters moved to now's day and month
-- (fresh: its month changed; old, the month it held, kept as <meter>|w).
local function meter_view(x)
  local f = x.S.meters[x.l.meter] or {-1, 0, -1, 0, 0}
  local mv = {d = f[1], du = f[2], m = f[3], mu = f[4], mo = f[5]}
  if mv.d ~= x.day then mv.d, mv.du = x.day, 0 end
  if mv.m ~= x.month then
    if mv.m >= 0 and mv.m < x.month then mv.old = string.format('%d,%d,%d', mv.m, mv.mu, mv.mo) end
    mv.m, mv.mu, mv.mo, mv.fresh = x.month, 0, 0, true
  end
  x.mv = mv
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
  local res = {x.ok and 1 or 0, x.mask, x.retry, 0, x.now, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
  for i = 1, 2 do
    local c, j = x.burst[i], 3 + 4 * i
    if c then res[j], res[j + 1], res[j + 2], res[j + 3] = burst_item(c, x.now, consumed) end
  end
  local spent, over, mover = 0, 0, 0
  if consumed then spent = x.cost end
  for _, c in ipairs(x.claims) do
    local e = c.e
    if consumed and e.meter then mover = mover + c.billed elseif consumed then over = over + c.billed end
    local used, limit = KIND.room(x, e)
    local j = 3 + 4 * e.item
    res[j], res[j + 1], res[j + 2] = 1, limit, math.max(0, limit - used - spent)
    res[j + 3] = e.monthly and x.mnext or x.dnext
  end
  res[4], res[31], x.overage, x.moverage = over, mover, over, mover
  if not consumed then x.billed = 0 end
  return res
end

-- commit_meter counts an admission in its meter's field (the month it
-- ends kept as <meter>|w), and its meter overage in the month's spend
-- ('$', the month before as '$w') when there is a cap.
local function commit_meter(x, price)
  local S, mv, m = x.S, x.mv, x.l.meter
  mv.du, mv.mu, mv.mo = mv.du + x.cost, mv.mu + x.cost, mv.mo + x.moverage
  S.meters[m] = {mv.d, mv.du, mv.m, mv.mu, mv.mo}
  put(S.qh, m, string.format('%d,%d,%d,%d,%d', mv.d, mv.du, mv.m, mv.mu, mv.mo))
  if x.moverage > 0 and x.cap then
    local sp = S.spent
    if sp[1] ~= 0 and sp[1] < x.month then put(S.qh, '$w', string.format('%d,%d', sp[1], sp[2])) end
    S.spent = {x.month, x.spent + x.moverage * price}
    put(S.qh, '$', string.format('%d,%d', x.month, S.spent[2]))
  end
  if mv.fresh then
    if mv.old then put(S.qh, m .. '|w', mv.old) end
    S.kqx = x.mnext + (x.pp and PREPAID_KEEP_US or HOUR_US)
  end
end

-- count_pending counts the hour's pending counters: the overage, a
-- refusal (degraded or not), a shadow refusal; not a replay of a tenant
-- without state.
local function count_pending(x, counted)
  local S = x.S
  if x.meter == '' or not S.held and x.ok and x.replay then return end
  -- (a tenant with state keeps them in its hash, "p" before them)
  local b, pre = S.ph, fmt(idiv(x.now, HOUR_US) * 3600) .. '|' .. x.meter .. '|'
  if S.held then b, pre = S.th, 'p' .. pre end
  if counted and x.overage > 0 then add(b, pre .. 'o', x.overage) end
  if counted and x.moverage > 0 then add(b, pre .. 'm', x.moverage) end
  if not x.ok then add(b, pre .. (x.mask % 64 >= 32 and 'd' or 'x'), 1) end
  if x.shadowed then add(b, pre .. 's', 1) end
end

-- expire moves the state's expiry past need, a day beyond (so that
-- PEXPIREAT goes about once a day); a state new to the hash lives until
-- it is empty again.
local function expire(x, v, need)
  if not x.S.held then
    need = math.max(need, x.now + HOUR_US, v.g, v.b, x.dnext + HOUR_US, x.mnext + HOUR_US)
  end
  if need > v.x then v.x = -idiv(-(need + DAY_US), HOUR_US) * HOUR_US end
end

-- commit writes an admission (mode admit) into the state: the burst
-- limits' times (a refusal keeps a clamp), the quotas, the meter, the
-- credit's draws, the hour's pending usage; the counters only when
-- something of them changed.
local function commit(x)
  local S, v, now, cost = x.S, x.v, x.now, x.cost
  local counted = x.ok and not x.replay
  local need, dirty, mprice, has_meter = 0, false, 0, false
  for i = 1, 2 do
    local c = x.burst[i]
    if c and (x.ok or c.clamped) then
      local t = x.ok and c.next or c.start
      if i == 1 then v.g = t else v.b = t end
      need, dirty = math.max(need, t), true
    end
  end
  for _, c in ipairs(x.claims) do
    local e = c.e
    if e.meter then
      has_meter = true
      if e.monthly then mprice = e.price end
    elseif counted and e.monthly then
      v.mu, v.mo = v.mu + cost, v.mo + x.overage
      need, dirty = math.max(need, x.mnext + HOUR_US), true
    elseif counted then
      v.du = v.du + cost
      need, dirty = math.max(need, x.dnext + HOUR_US), true
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
    local n, r = 0, 0
    if S.usage[x.pk] then n, r = string.match(S.usage[x.pk], '^(%-?%d+),(%-?%d+)$') end
    usage = string.format('%d,%d', n + cost, r + 1)
    S.usage[x.pk] = usage
    need, dirty = math.max(need, now + PENDING_US), true
  end
  if dirty then
    -- (the fields in the order one admission's HSET writes them: a group
    -- leaves the hash's layout as its requests alone would)
    put(S.th, 't', true)
    put(S.th, 'q', true)
    put(S.th, 'c', true)
    if x.w then put(S.th, 'w', x.w) end
    if x.relim then S.L = x.l.sig; put(S.th, 'L', S.L) end
    if usage then put(S.th, x.pk, usage) end
    if x.rolled and S.held and v.gn > 0 then S.dropg, v.gn = true, 0 end
    expire(x, v, need)
    S.c, S.held = v, true
  end
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
    for i = 23, 30 do out[i] = res[i] end
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

-- decide decides one request q on the state S: the interpreter's loop.
local function decide(S, q)
  local Aq = q.A
  local x = {S = S, q = q, l = q.l, now = q.now, mode = Aq[A.mode], cost = Aq[A.cost] + 0, meter = Aq[A.meter],
    pk = q.pk, ok = true, mask = 0, retry = 0, burst = {}, claims = {}, claimed = 0, billed = 0, fresh = 0,
    fclaimed = 0, spent = 0}
  SHIFT = q.shift
  local np = Aq[A.policies] + 0
  if x.mode == 'admit' and #q.K - np >= KY.idem then x.idem = q.K[KY.idem] end
  if x.idem then
    local code = idem_check(x)
    if code then
      local r = {0, 0, 0, 0, x.now, code}
      for i = 7, 31 do r[i] = 0 end
      return r
    end
  end
  x.v = view(S)
  local cal = Aq[A.calendar]
  if not periods(x, cal ~= '' and cal or nil) then return redis.error_reply('CALENDAR ' .. fmt(x.now)) end
  limit_change(x)
  if x.l.meter then meter_view(x) end
  if S.spent[1] == x.month then x.spent = S.spent[2] end
  local pp = Aq[A.prepaid]
  if pp ~= '' then
    local p = ints(pp)
    x.pp = {bal = p[1], id = p[2], prev = p[3], lines = p[4], exp = p[5]}
  end
  for _, e in ipairs(x.l.entries) do
    local err = KIND[e.k](x, e)
    if err then return redis.error_reply(err) end
  end
  policies(x)
  local res = report(x)
  if x.mode == 'admit' then
    if x.ok and x.precs then policies_commit(x.precs, x.now, x.replay) end
    commit(x)
  end
  return answer(x, res)
end

-- state_write writes what the decisions changed, each hash's fields in
-- the order they were first written (HSET runs, HINCRBY for counters):
-- the tenant's hash (its t, q, c from the state; its expiry when it
-- moved), the pending hash, the meter hash.
local function state_write(S)
  local c = S.c
  if S.dropg then
    local h = redis.call('HGETALL', S.ks)
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 2) == 'g:' then redis.call('HDEL', S.ks, h[i]) end
    end
  end
  if S.th.set.t then
    local s = {g = c.g, b = c.b, d = c.d, du = c.du, dg = c.dg, m = c.m, mu = c.mu, mg = c.mg, mo = c.mo,
      gn = c.gn, x = c.x, mn = c.mn, cal = c.mn == 0}
    S.th.set.t, S.th.set.q, S.th.set.c = packed(s)
  end
  flush(S.ks, S.th)
  if S.th.set.t and c.x ~= S.x0 then redis.call('PEXPIREAT', S.ks, pxat(c.x)) end
  if flush(S.kp, S.ph) then redis.call('PEXPIRE', S.kp, PENDING_MS) end
  flush(S.kq, S.qh)
  if S.kqx then redis.call('PEXPIREAT', S.kq, pxat(S.kqx)) end
end

-- prepare reads what a request's state read needs: its time (and the
-- shift of its expiries), its list, its hour's pending usage field.
local function prepare(q)
  q.now, q.shift = clock(q.A[A.now] + 0)
  q.l = list_of(q.A[A.list])
  if q.A[A.mode] == 'admit' then
    q.pk = 'p' .. idiv(q.now, HOUR_US) .. '|' .. q.A[A.meter] .. '|'
  end
end

-- failed is the answer of a request that raised err: its error reply.
local function failed(err)
  if type(err) == 'table' then return err end
  return redis.error_reply(tostring(err))
end

admit_run = function(reqs, isolate)
  local live, out = {}, {}
  for _, q in ipairs(reqs) do
    if isolate then
      local ok, err = pcall(prepare, q)
      if not ok then q.err = failed(err) end
    else
      prepare(q)
    end
    if not q.err then live[#live + 1] = q end
  end
  local S = #live > 0 and state_read(live)
  for i, q in ipairs(reqs) do
    if q.err then
      out[i] = q.err
    elseif isolate then
      local ok, r = pcall(decide, S, q)
      out[i] = ok and r or failed(r)
    else
      out[i] = decide(S, q)
    end
  end
  if S then state_write(S) end
  return out
end

function FN.admit()
  return admit_run({{K = KEYS, A = ARGV}})[1]
end
end
