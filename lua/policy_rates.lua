--[[ policy_rates.lua: the rate algorithms of the policies: token_bucket,
gcra, leaky_bucket and warm_up (see policy.lua for the contract of check,
commit, undo and release, and internal/policyalg/rates.go for their pure-Go
models, which the tests of internal/ratelimit hold to the same answers, to
the microsecond and to the last bit of warm_up's doubles).

One Redis key per policy instance, a string:
  token_bucket   "FULL,d"  us: when the bucket is full again, and its debt
                           FULL - W when it was written at W
  gcra           "TAT,d"   us: the theoretical arrival time, and TAT - W
  leaky_bucket   TAT       us: when the queue has drained
  warm_up        "s,nf,c"  Guava's storedPermits ('%.17g', which round-trips
                           a double), nextFreeTicket (us), and c: after how
                           many us from nf the permits are all stored again
                           (cold)
An absent key is the empty state (a full bucket, a drained queue, a cold
warm_up), and a state that time has made empty is the same as an absent key
(FULL or TAT <= now; warm_up's permits all stored again): so every write sets
an expiry of when the state is empty again, relative (PX: the script's now
may be an explicit test time) and rounded up to the ms, + SLACK_MS; an undo
that leaves the state empty deletes the key.

Commands per policy and decision: GET (check), SET .. PX (commit, only when
the request is admitted). undo: GET, then SET .. PX or DEL. undo needs no
particular now (it moves the state back by the request's share). Memory per
key (MEMORY USAGE, with a key name of about 50 bytes): about 104 bytes for
leaky_bucket (an integer-encoded string), 136 for the others (a short
embedded string).

Remaining when a policy admits but the call is not consumed (a dry run, a
refusal elsewhere): policy.lua adds w back to the remaining of the
admission, at most the limit. That is the remaining as it is for
token_bucket and gcra (an admission takes exactly w from it); for
leaky_bucket (whose admission does not depend on w, and whose remaining is
at least 0) and warm_up (0 or 1) it is an approximation.

Bounds: every quantity is an integer in a double, exact below 2^53, as in
admit.lua: quota.Policy bounds C*U and (burst+1)*T by 2^50 us and warm_up's
S*F by 2^40; now is about 2^50.6. A weight is bounded per algorithm so that
its time stays below 2^50 too: w > C (token_bucket) or w > B (gcra) never
fits (a param exception may make C or B 0: nothing passes); w*T > 2^50
(leaky_bucket) or w*F*S > 2^50 (warm_up: a debt of more than 35 years) is
refused as never (retry -1) too.

token_bucket (a = capacity C units, b = U us per unit of refill)
  admit.lua's bucket in virtual-scheduling form: tokens(now) = C -
  max(0, FULL - now)/U. f = max(min(FULL, W + C*U), now) (the clamp, see
  below); new = f + w*U; admitted iff new - now <= C*U (w tokens are
  there). limit C; remaining = floor((C*U - (new - now))/U), of f when
  refused; reset = new (f when refused): full again; retry = new - C*U -
  now, -1 when w > C. undo: FULL -= w*U. Guarantee: in any window of t us
  at most C + t/U units pass.
gcra (a = burst B >= 1, b = T us per request)
  admit.lua's tier GCRA with a weight: tat = max(min(TAT, W + B*T), now)
  (the clamp, see below); new = tat + w*T; admitted iff new - now <= B*T;
  limit B; remaining = floor((B*T - (new - now))/T) (of tat when
  refused); reset = new (tat when refused); retry = new - B*T - now, -1
  when w > B. undo: TAT -= w*T.
  The arithmetic is the token bucket's (B for C, T for U): the two differ
  in how they are configured (rate and burst, capacity and refill) and in
  what the API reports. Guarantee: in any window of t us at most B + t/T
  requests (units) pass.
The clamp of token_bucket and gcra (limit changes): admit.lua reads a time
  written under other limits as the most indebted state the current ones
  allow, tat <= now + B*T, and writes that back even when it refuses. Here
  a refusal writes nothing (policy.lua: check never writes, commit only
  admissions), so a clamp against now would hold a request clamped, and
  refused with a retry of one interval, for as long as the old debt lasts:
  it would change no decision, only make Retry-After wrong. So the key
  keeps W, the time of its write, and the clamp is the same bound taken at
  W: TAT <= W + B*T (FULL <= W + C*U), as if the limits had changed right
  after that write. Unchanged limits never reach it (an admission at W
  leaves TAT <= W + B*T, an undo less); after a change the next request
  waits at most its own w intervals of the new limits, its retry is true,
  and the first admission writes state of the new limits.
leaky_bucket (a = burst, b = T us per request, c = max wait us, 0 = nodelay)
  nginx's limit_req. TAT is when the queue has drained; t0 = max(TAT, now)
  is this request's slot, t0 - now the wait of the requests ahead of it.
  nginx keeps excess (in requests, with a timestamp) and, for a request,
  computes excess = max(0, excess - rate*elapsed + 1): that is exactly
  (t0 - now)/T here (the requests queued ahead, this one's +1 included in
  the previous slot's end), and nginx refuses when excess > burst, i.e.
  t0 - now > burst*T. So:
    admitted iff t0 - now <= burst*T, and, with c > 0, t0 - now <= c;
    c > 0 (on_refuse queue: shaping, nginx without nodelay): the request
      waits delay = t0 - now, leaving at its slot t0;
    c = 0 (nginx nodelay): delay = 0: it passes at once, and its slot is
      taken all the same (the queue fills as nginx's excess does, so that
      a burst of burst+1 passes and then one per T).
  commit: TAT = t0 + w*T (a weight takes w slots). limit = burst + 1 (q);
  remaining = the requests of weight 1 that would be admitted at now after
  this one: max(0, floor((m - q)/T) + 1) with m = burst*T (min with c when
  c > 0) and q = the queue's wait after it (before it when refused); reset =
  when the queue has drained (t0 + w*T; t0 when refused); retry = t0 - now
  - m, the wait after which it is admitted. There is no clamp: a queue's
  depth in time depends on the weights that filled it, so no bound that
  unchanged limits never reach exists; a queue written under a slower rate
  drains at that rate (nginx, which keeps excess in requests, would drain
  it at the new one). undo: TAT -= w*T. Guarantee: accepted requests leave
  (at now + delay) at most burst + w + t/T units in any window of t us (w
  the last one's weight: burst + 1 + t/T for requests).
warm_up (a = S us per permit at the stable rate, b = W warm-up us, c = cold
  factor F): Guava's SmoothWarmingUp, with tryAcquire's decision:
    thresholdPermits = 0.5*W/S; maxPermits = threshold + 2*W/(S + F*S);
    slope = (F*S - S)/(maxPermits - threshold); coolDown = W/maxPermits;
    resync: at now > nf, storedPermits += (now - nf)/coolDown, at most
      maxPermits, and nf = now;
    admitted iff nf <= now (the request itself never waits: its permits'
      price is paid by the next request, as in Guava); then resync, and w
      permits are reserved: min(w, stored) stored ones, priced on the ramp
      (the trapezoid above the threshold, S each below it, truncated to a
      whole us as Guava's (long) casts), and the rest fresh at S each
      (truncated); nf += that wait; stored -= the stored ones spent.
  A fresh key is cold: storedPermits = maxPermits (as Guava's limiter
  starts), nf = now. The key keeps, beside s and nf, when it is cold again
  under the limits it was written with: nf + ceil((maxPermits -
  s)*coolDown) + 1 (the +1 us absorbs the rounding of the resync's
  division); from then on it reads as a fresh key (and expires then +
  SLACK_MS). Under unchanged limits that is exactly what the resync
  computes (all permits stored, nf = now); it makes an expired key and a
  key read after its cold-at time the same state whatever the current
  limits. Doubles are computed with the same operations in the same order
  as Guava and the Go model. Limit changes: a limiter that cooled down
  stays cold (as Guava's setRate, which rescales storedPermits, keeps a
  full one full); otherwise storedPermits is read as at most the new
  maxPermits (the key does not keep the old one to rescale it), and nf
  stands (as in Guava's setRate). limit = the stable rate per second,
  floor(1e6/S), at least 1; remaining = 1 when a request
  would be admitted now after this one (nf <= now), else 0: it is 0 after
  every admission (a permit costs at least a us), so it says whether the
  limiter is free now; reset = nf (resynced: at least now); retry = nf -
  now. undo gives the permits back: stored += w (at most maxPermits), nf
  -= w*S: the limiter ends no warmer and no earlier than before the
  request, but for Guava's truncations (< 3 us). Guarantee: the gaps
  between admissions are each request's price: at least w*S (the stable
  rate), and up to w*F*S while cold (storedPermits above the threshold).

Everything is inside one block, run once when the library is loaded; only
POL's entries leave it.
]]

do
  local MAXW = 1125899906842624 -- 2^50: the longest time a state may hold
  local SLACK_MS = 1000

  -- px is the expiry, in ms relative to now, of a state empty at need:
  -- rounded up, + SLACK_MS.
  local function px(need, now)
    local ms = -idiv(-(need - now), 1000)
    if ms < 0 then ms = 0 end
    return fmt(ms + SLACK_MS)
  end

  -- vs_read returns the time of k (FULL, TAT) and when it was written: 0,
  -- 0 when k does not exist.
  local function vs_read(k)
    local v = redis.call('GET', k)
    if not v then return 0, 0 end
    local t, d = string.match(v, '^(%d+),(%-?%d+)$')
    t = t + 0
    return t, t - d
  end

  -- vs_write writes time t of k, written at wr.
  local function vs_write(k, now, t, wr)
    redis.call('SET', k, fmt(t) .. ',' .. fmt(t - wr), 'PX', px(t, now))
  end

  -- room is floor((n - x)/u), at least 0.
  local function room(n, x, u)
    local r = idiv(n - x, u)
    if r < 0 then r = 0 end
    return r
  end

  -- vsched is the token bucket and GCRA (one implementation of the same
  -- arithmetic): p[1] units of capacity (burst), p[2] us each (see the
  -- header).
  local function vsched_check(k, now, w, p)
    local c, u = p[1], p[2]
    local cu = c * u
    local f, wr = vs_read(k)
    if f > wr + cu then f = wr + cu end
    if f < now then f = now end
    local wait
    local new
    if w > c then
      wait = -1
    else
      new = f + w * u
      if new - now > cu then wait = new - cu - now end
    end
    if wait then
      return false, wait, c, room(cu, f - now, u), f, 0
    end
    return true, 0, c, room(cu, new - now, u), new, 0, new
  end

  local function vsched_commit(k, now, w, p, st)
    vs_write(k, now, st, now)
  end

  -- vsched_undo moves the time back by w*u, keeping when it was written (a
  -- weight over the capacity was never admitted).
  local function vsched_undo(k, now, w, p)
    if w > p[1] then return end
    local t, wr = vs_read(k)
    if t == 0 then return end
    t = t - w * p[2]
    if t <= now then
      redis.call('DEL', k)
    else
      vs_write(k, now, t, wr)
    end
  end

  POL.token_bucket = {check = vsched_check, commit = vsched_commit, undo = vsched_undo}
  POL.gcra = POL.token_bucket

  -- slots is the requests of weight 1 admitted at now behind a queue of q
  -- us, with m the longest queue admitted and T us a slot.
  local function slots(m, q, T)
    local r = idiv(m - q, T) + 1
    if r < 0 then r = 0 end
    return r
  end

  -- lb_commit writes the queue's end t (st) of k.
  local function lb_commit(k, now, w, p, t)
    redis.call('SET', k, fmt(t), 'PX', px(t, now))
  end

  POL.leaky_bucket = {
    check = function(k, now, w, p)
      local burst, T, c = p[1], p[2], p[3]
      local t0 = redis.call('GET', k)
      if t0 then t0 = t0 + 0 else t0 = 0 end
      if t0 < now then t0 = now end
      local q = t0 - now
      local m = burst * T
      if c > 0 and c < m then m = c end
      if w > idiv(MAXW, T) then
        return false, -1, burst + 1, slots(m, q, T), t0, 0
      end
      if q > m then
        return false, q - m, burst + 1, slots(m, q, T), t0, 0
      end
      local new = t0 + w * T
      local delay = 0
      if c > 0 then delay = q end
      return true, 0, burst + 1, slots(m, new - now, T), new, delay, new
    end,
    commit = lb_commit,
    -- undo moves the queue's end back by w*T; a queue that has drained is
    -- the empty state: the key goes.
    undo = function(k, now, w, p)
      if w > idiv(MAXW, p[2]) then return end
      local t = redis.call('GET', k)
      if not t then return end
      t = t - w * p[2]
      if t <= now then
        redis.call('DEL', k)
      else
        lb_commit(k, now, w, p, t)
      end
    end,
  }

  -- wu_params derives SmoothWarmingUp's doubles from S, W and F, as
  -- Guava's doSetRate and coolDownIntervalMicros do.
  local function wu_params(p)
    local S, W, F = p[1], p[2], p[3]
    local cold = S * F
    local thr = 0.5 * W / S
    local maxp = thr + 2.0 * W / (S + cold)
    local slope = (cold - S) / (maxp - thr)
    return S, F, thr, maxp, slope, W / maxp
  end

  -- wu_read returns the stored permits (at most maxp) and nextFree of k at
  -- now, and whether k exists: cold (maxp, now) when it does not or when
  -- its permits are all stored again (its cold-at time has come).
  local function wu_read(k, now, maxp)
    local v = redis.call('GET', k)
    if not v then return maxp, now, false end
    local a, b, c = string.match(v, '^([^,]+),(%-?%d+),(%d+)$')
    local nf = b + 0
    if now >= nf + c then return maxp, now, true end
    local s = tonumber(a)
    if s > maxp then s = maxp end
    return s, nf, true
  end

  -- wu_cold is when the permits are all stored again, from s and nf (+1 us
  -- against the rounding of the resync's division).
  local function wu_cold(s, nf, maxp, cool)
    return nf + math.ceil((maxp - s) * cool) + 1
  end

  -- wu_write stores s, nf and when it is cold again (after nf), to expire
  -- then.
  local function wu_write(k, now, s, nf, cold)
    redis.call('SET', k, string.format('%.17g,%d,%d', s, nf, cold - nf), 'PX', px(cold, now))
  end

  -- wu_wait is Guava's storedPermitsToWaitTime: the price of take of the
  -- stored permits, the trapezoid of the ramp above the threshold and S
  -- each below it, each part truncated as Guava's (long) casts.
  local function wu_wait(S, thr, slope, stored, take)
    local above = stored - thr
    local micros = 0
    if above > 0 then
      local t = math.min(above, take)
      local length = (S + above * slope) + (S + (above - t) * slope)
      micros = math.floor(t * length / 2.0)
      take = take - t
    end
    return micros + math.floor(S * take)
  end

  POL.warm_up = {
    check = function(k, now, w, p)
      local S, F, thr, maxp, slope, cool = wu_params(p)
      local limit = idiv(US, S)
      if limit < 1 then limit = 1 end
      local s, nf = wu_read(k, now, maxp)
      if w > idiv(MAXW, F * S) then
        if nf < now then nf = now end
        local rem = 0
        if nf <= now then rem = 1 end
        return false, -1, limit, rem, nf, 0
      end
      if nf > now then
        return false, nf - now, limit, 0, nf, 0
      end
      if now > nf then
        s = math.min(maxp, s + (now - nf) / cool)
        nf = now
      end
      local spend = math.min(w, s)
      local fresh = w - spend
      nf = nf + wu_wait(S, thr, slope, s, spend) + math.floor(fresh * S)
      s = s - spend
      local rem = 0
      if nf <= now then rem = 1 end
      return true, 0, limit, rem, nf, 0, {s, nf, wu_cold(s, nf, maxp, cool)}
    end,
    commit = function(k, now, w, p, st)
      wu_write(k, now, st[1], st[2], st[3])
    end,
    undo = function(k, now, w, p)
      local S, F, _, maxp, _, cool = wu_params(p)
      if w > idiv(MAXW, F * S) then return end
      local s, nf, found = wu_read(k, now, maxp)
      if not found then return end
      s = math.min(maxp, s + w)
      nf = nf - w * S
      local cold = wu_cold(s, nf, maxp, cool)
      if cold <= now then
        redis.call('DEL', k)
      else
        wu_write(k, now, s, nf, cold)
      end
    end,
  }
end
