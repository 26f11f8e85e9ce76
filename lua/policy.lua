--[[ policy.lua: the policies' framework, shared by the library's functions
admit (admit.lua) and policy_run (policy_run.lua); after state.lua, before
the algorithms of policy_windows.lua and policy_rates.lua. internal/policyalg
holds the pure-Go reference of every algorithm; the tests hold the two to
identical answers.

A policy instance is one Redis key (the Go side names it: the policy, its
scope and the scope's value) and one group of POLICY_ARGS arguments:
  alg   the algorithm's name (quota.Algorithm)
  how   0 reject, 1 queue, 2 shadow, 3 degrade (what a refusal does)
  w     the weight of the request: 1 (cost "requests") or the route's cost
  a, b, c, d   the algorithm's integer parameters (see each algorithm)

Every algorithm registers POL[alg] = {check, commit, undo, release}:
  check(k, now, w, p)     -> ok, retry, limit, remaining, reset, delay, st
      decides whether w fits at now (us) and writes nothing that changes a
      later decision (dropping entries that have expired is allowed).
      retry: us until the same request would pass (0 when ok, -1 never);
      remaining: after this admission when ok, as it is when not;
      reset: absolute us when the limit is full again (or the window ends);
      delay: us the request must wait before it proceeds (leaky_bucket's
      shaping), else 0; st: anything commit gets back.
  commit(k, now, w, p, st) writes the admission and the key's expiry.
  undo(k, now, w, p)      rolls back a committed admission (the reservation
      of a policy in another slot, when the tenant's script refuses).
  release(k, now, w, p)   ends a lease (concurrency), else nil. An
      algorithm with a release is not committed for a replay
      (policies_commit).
  undo and release return true when they gave a slot back to a full
  state (concurrency: queued requests may take it), else nil or false.
p holds the parameters: p[1]..p[4] (a..d, numbers) and p.id (the request's
id, a string unique per request: concurrency's lease, the log's member).

Outcomes, per policy, as reported:
  1 admitted (and consumed when the request is)
  0 refused: the request is refused (reject, queue)
  2 refused in shadow: the request goes on; the refusal is only counted
  3 refused, degrade: the request gets the fallback answer; nothing is
    consumed or charged
]]

-- POL maps an algorithm to its functions, defined once, when the library
-- is loaded (policy_windows.lua, policy_rates.lua).
local POL = {}
local POLICY_ARGS = 7

-- POL_SHIFT is the (TIME - now) of the expiries that policy_windows.lua's
-- algorithms write in the call running, read at its first expiry: nil
-- until then (policies_begin).
local POL_SHIFT

-- policies_begin starts a call's policies: the first expiry reads TIME.
local function policies_begin()
  POL_SHIFT = nil
end

-- policy_impl returns POL[alg]; nil for an unknown algorithm.
local function policy_impl(alg)
  return POL[alg]
end
local POLICY_ITEM = 7 -- outcome, limit, remaining, reset, retry, delay, how

-- policies_check decides n policies whose keys start at KEYS[k0] and whose
-- argument groups start at ARGV[a0]. It returns whether the enforced ones
-- (reject, queue) all admit, whether a degrade one refused, the longest
-- retry of the refusing enforced ones (-1 wins), and the per-policy
-- records {alg, key, w, p, ok, st, how, item...} for commit and report.
local function policies_check(k0, a0, n, now, id)
  policies_begin()
  local pass, degraded, retry = true, false, 0
  local recs = {}
  for i = 0, n - 1 do
    local j = a0 + i * POLICY_ARGS
    local alg, how, w = ARGV[j], ARGV[j + 1] + 0, ARGV[j + 2] + 0
    local p = {ARGV[j + 3] + 0, ARGV[j + 4] + 0, ARGV[j + 5] + 0, ARGV[j + 6] + 0, id = id}
    local k = KEYS[k0 + i]
    local impl = policy_impl(alg)
    if not impl then error('tollgate: unknown algorithm ' .. tostring(alg)) end
    local ok, rt, limit, remaining, reset, delay, st = impl.check(k, now, w, p)
    local outcome = 1
    if not ok then
      if how == 2 then
        outcome = 2
      elseif how == 3 then
        outcome, degraded = 3, true
      else
        outcome, pass = 0, false
        if retry ~= -1 and (rt < 0 or rt > retry) then retry = rt end
      end
    end
    recs[#recs + 1] = {impl = impl, k = k, w = w, p = p, st = st, outcome = outcome,
      limit = limit, remaining = remaining, reset = reset, retry = ok and 0 or rt,
      delay = delay or 0, how = how}
  end
  return pass, degraded, retry, recs
end

-- policies_commit writes the admissions of the policies that admitted
-- (a shadow refusal consumes nothing of its own policy). A replay (an
-- idempotent repeat answered from its stored answer) is load, and spends
-- the rate limits, but it has no answer to wait for: an algorithm that
-- holds its admission until a release (concurrency's lease) is not
-- committed for it, and reports its room as it is (r.held false).
local function policies_commit(recs, now, replay)
  for _, r in ipairs(recs) do
    if r.outcome == 1 then
      if replay and r.impl.release then
        r.held = false
      else
        r.impl.commit(r.k, now, r.w, r.p, r.st)
      end
    end
  end
end

-- policies_report appends each policy's POLICY_ITEM integers to res. A
-- policy that admitted a request that was refused elsewhere (or a replay
-- it holds nothing for) reports its room as it is (its check's remaining
-- counted this request: add it back).
local function policies_report(res, recs, consumed)
  for _, r in ipairs(recs) do
    local remaining = r.remaining
    if r.outcome == 1 and (not consumed or r.held == false) then
      remaining = remaining + r.w
      if remaining > r.limit then remaining = r.limit end
    end
    res[#res + 1] = r.outcome
    res[#res + 1] = r.limit
    res[#res + 1] = remaining
    res[#res + 1] = r.reset
    res[#res + 1] = r.retry
    res[#res + 1] = r.delay
    res[#res + 1] = r.how
  end
  return res
end
