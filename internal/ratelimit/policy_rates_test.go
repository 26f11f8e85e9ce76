package ratelimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/policyalg"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The rate algorithms of lua/policy_rates.lua (token_bucket, gcra,
// leaky_bucket, warm_up) against their models in internal/policyalg.

var rateAlgs = []quota.Algorithm{quota.AlgTokenBucket, quota.AlgGCRA, quota.AlgLeakyBucket, quota.AlgWarmUp}

// ratePolicy is a policy instance of a schedule: its spec (key, algorithm,
// refusal, parameters), its model, and whether it counts the request's
// cost (else 1 per request).
type ratePolicy struct {
	spec  PolicySpec
	model policyalg.Model
	units bool
}

// rateParams draws an algorithm's parameters; how is the refusal (queue
// gives leaky_bucket a max wait, as policyalg.ParamsOf does).
func rateParams(rng *rand.Rand, alg quota.Algorithm, how int64) policyalg.Params {
	iv := []int64{1, 7, 1000, 20_000, 1_000_000}[rng.IntN(5)]
	n := 1 + rng.Int64N(6)
	if rng.IntN(30) == 0 {
		n = 0 // a param exception of 0: nothing passes
	}
	switch alg {
	case quota.AlgTokenBucket, quota.AlgGCRA:
		return policyalg.Params{n, iv}
	case quota.AlgLeakyBucket:
		var wait int64
		if how == HowQueue {
			wait = 1 + rng.Int64N((n+1)*iv)
		}
		return policyalg.Params{n, iv, wait}
	}
	s := []int64{12_345, 100_000, 250_000, 500_000}[rng.IntN(4)]
	return policyalg.Params{s, 1_000_000 * (1 + rng.Int64N(3)), 2 + rng.Int64N(5)}
}

// rateSpan is how long (us) the state of p may matter: the scale of a
// schedule's gaps.
func rateSpan(alg quota.Algorithm, p policyalg.Params) int64 {
	if alg == quota.AlgWarmUp {
		return p[1] + 3*p[0]*p[2]
	}
	return (p[0] + 1) * p[1]
}

func newRatePolicy(rng *rand.Rand, key string, alg quota.Algorithm) *ratePolicy {
	how := []int64{HowReject, HowReject, HowQueue, HowShadow, HowDegrade}[rng.IntN(5)]
	if alg == quota.AlgLeakyBucket && rng.IntN(3) == 0 {
		how = HowQueue // shaping: delays
	}
	p := rateParams(rng, alg, how)
	m, err := policyalg.New(alg, p)
	if err != nil {
		panic(err)
	}
	return &ratePolicy{spec: PolicySpec{Key: key, Alg: alg, How: how, Params: p}, model: m, units: rng.IntN(2) == 0}
}

// rateExpect is lua/policy_run.lua and policy.lua's framework over the
// models: the answer RunPolicies must give (for 'admit' and 'dry'), with
// the admitted policies committed when every enforced one admits.
func rateExpect(mode string, now int64, id string, specs []PolicySpec, models []policyalg.Model) PolicyResult {
	if mode == PolicyUndo {
		for i, s := range specs {
			models[i].Undo(now, s.Weight, id)
		}
		return PolicyResult{Allowed: true}
	}
	pass, degraded, retry := true, false, int64(0)
	items := make([]PolicyItem, len(specs))
	for i, s := range specs {
		r := models[i].Check(now, s.Weight)
		it := PolicyItem{Outcome: 1, Limit: r.Limit, Remaining: r.Remaining, Reset: r.Reset, Delay: r.Delay, How: s.How}
		if !r.OK {
			it.Retry = r.Retry
			switch s.How {
			case HowShadow:
				it.Outcome = 2
			case HowDegrade:
				it.Outcome, degraded = 3, true
			default:
				it.Outcome, pass = 0, false
				if retry != -1 && (r.Retry < 0 || r.Retry > retry) {
					retry = r.Retry
				}
			}
		}
		items[i] = it
	}
	ok := pass && !degraded
	consumed := ok && mode == PolicyAdmit
	for i, s := range specs {
		if items[i].Outcome != 1 {
			continue
		}
		if consumed {
			models[i].Commit(now, s.Weight, id)
		} else {
			items[i].Remaining = min(items[i].Remaining+s.Weight, items[i].Limit)
		}
	}
	out := PolicyResult{Allowed: ok, Now: now, Degraded: degraded, Items: items}
	if !ok {
		out.Retry = retry
	}
	return out
}

// rateFmt prints every field of r on one line, so that two results compare
// as strings and a mismatch shows both in full.
func rateFmt(r PolicyResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "allowed=%t now=%d retry=%d degraded=%t", r.Allowed, r.Now, r.Retry, r.Degraded)
	for _, it := range r.Items {
		fmt.Fprintf(&b, " | out=%d limit=%d rem=%d reset=%d retry=%d delay=%d how=%d",
			it.Outcome, it.Limit, it.Remaining, it.Reset, it.Retry, it.Delay, it.How)
	}
	return b.String()
}

// rateAbsent is rateKeyState's record of a key that does not exist.
const rateAbsent = "absent"

// rateKeyState returns, per key, its content and absolute expiry (DUMP and
// PEXPIRETIME, in one transaction, so that a key expiring meanwhile is seen
// whole or not at all): equal only when nothing about the keys changed.
func rateKeyState(tb testing.TB, c redis.UniversalClient, keys []string) []string {
	tb.Helper()
	ctx := context.Background()
	out := make([]string, len(keys))
	for i, k := range keys {
		var dump *redis.StringCmd
		var at *redis.DurationCmd
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			dump = p.Dump(ctx, k)
			at = p.PExpireTime(ctx, k)
			return nil
		})
		if err != nil && err != redis.Nil {
			tb.Fatalf("DUMP, PEXPIRETIME %s: %v", k, err)
		}
		if dump.Err() == redis.Nil {
			out[i] = rateAbsent
			continue
		}
		out[i] = fmt.Sprintf("%x@%d", dump.Val(), at.Val())
	}
	return out
}

// rateCompareKey compares a key's content with its model's state at now:
// equal, or the key absent and the model's state empty by time (what an
// expired or deleted key means).
func rateCompareKey(tb testing.TB, c redis.UniversalClient, p *ratePolicy, now int64) string {
	tb.Helper()
	v, err := c.Get(context.Background(), p.spec.Key).Result()
	if err != nil && err != redis.Nil {
		tb.Fatalf("GET %s: %v", p.spec.Key, err)
	}
	absent := err == redis.Nil
	need, content := rateModelKey(p.model)
	switch m := p.model.(type) {
	case *policyalg.WarmUp:
		if absent {
			if m.Has && m.Need() > now {
				return fmt.Sprintf("%s: absent, but the model holds %.17g,%d (cold again at %d)", p.spec.Alg, m.Stored, m.NextFree, m.ColdAt)
			}
			return ""
		}
		f := strings.Split(v, ",")
		if len(f) != 3 || !m.Has {
			return fmt.Sprintf("%s: key %q, model has %t", p.spec.Alg, v, m.Has)
		}
		stored, err1 := strconv.ParseFloat(f[0], 64)
		next, err2 := strconv.ParseInt(f[1], 10, 64)
		cold, err3 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || math.Float64bits(stored) != math.Float64bits(m.Stored) ||
			next != m.NextFree || next+cold != m.ColdAt {
			return fmt.Sprintf("%s: key %q, model %.17g,%d,%d", p.spec.Alg, v, m.Stored, m.NextFree, m.ColdAt-m.NextFree)
		}
		return ""
	}
	if absent {
		if need > now {
			return fmt.Sprintf("%s: absent, but the model holds %s, > now %d", p.spec.Alg, content, now)
		}
		return ""
	}
	if v != content {
		return fmt.Sprintf("%s: key %q, model %q", p.spec.Alg, v, content)
	}
	return ""
}

// rateModelKey returns when (us) the model's state is empty by time (when
// its key expires, before the slack) and what its key holds.
func rateModelKey(m policyalg.Model) (need int64, content string) {
	switch m := m.(type) {
	case *policyalg.TokenBucket:
		full, wr := m.Full()
		return full, fmt.Sprintf("%d,%d", full, full-wr)
	case *policyalg.GCRA:
		tat, wr := m.TAT()
		return tat, fmt.Sprintf("%d,%d", tat, tat-wr)
	case *policyalg.LeakyBucket:
		return m.TAT, strconv.FormatInt(m.TAT, 10)
	case *policyalg.WarmUp:
		return m.Need(), fmt.Sprintf("%s,%d,%d", strconv.FormatFloat(m.Stored, 'g', -1, 64), m.NextFree, m.ColdAt-m.NextFree)
	}
	panic(fmt.Sprintf("no key of %T", m))
}

// rateSlackMS is lua/policy_rates.lua's SLACK_MS.
const rateSlackMS = 1000

// rateKeepAlive makes sure that p's key outlives the next call when its
// state matters at now: the keys' expiries are relative to the script's
// now, so a key expires in real time, and on a loaded machine a schedule's
// real time can run ahead of its script time. A key that expired that way
// is written back as the script left it (rateCheckExpiry checked its
// expiry when the script wrote it); it returns 1 then.
func rateKeepAlive(tb testing.TB, c redis.UniversalClient, p *ratePolicy, now int64) int {
	tb.Helper()
	ctx := context.Background()
	need, content := rateModelKey(p.model)
	if need <= now {
		return 0
	}
	const keep = 30 * time.Second
	ttl, err := c.PTTL(ctx, p.spec.Key).Result()
	if err != nil {
		tb.Fatalf("PTTL %s: %v", p.spec.Key, err)
	}
	switch {
	case ttl == -2:
		if err := c.Set(ctx, p.spec.Key, content, keep).Err(); err != nil {
			tb.Fatal(err)
		}
		return 1
	case ttl >= 0 && ttl < keep:
		if err := c.PExpire(ctx, p.spec.Key, keep).Err(); err != nil {
			tb.Fatal(err)
		}
	}
	return 0
}

// rateRedisMS is Redis's clock, in ms.
func rateRedisMS(tb testing.TB, c redis.UniversalClient) int64 {
	tb.Helper()
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return tm.UnixMilli()
}

// rateCheckExpiry checks the expiry of a key written by a call at now that
// ran between Redis times lo and hi (ms): when its model's state is empty,
// rounded up to the ms, + the slack, after the call.
func rateCheckExpiry(tb testing.TB, c redis.UniversalClient, p *ratePolicy, now, lo, hi int64) string {
	tb.Helper()
	need, _ := rateModelKey(p.model)
	ttl := max(0, (need-now+999)/1000) + rateSlackMS
	d, err := c.PExpireTime(context.Background(), p.spec.Key).Result()
	if err != nil {
		tb.Fatal(err)
	}
	if d == -2 {
		return "" // expired meanwhile
	}
	if got := d.Milliseconds(); got < lo+ttl || got > hi+ttl+1 {
		return fmt.Sprintf("%s: expires at %d ms, want %d ms after the call (between %d and %d)", p.spec.Alg, got, ttl, lo+ttl, hi+ttl+1)
	}
	return ""
}

// rateCall is an admitted call of a schedule, for a later undo: its id and
// the specs of the policies it committed.
type rateCall struct {
	id    string
	specs []int // indexes into the schedule's policies
	w     []int64
}

// TestPolicyRatesMatchModels drives random schedules through RunPolicies
// (explicit now) and the models: every answer equal, every key equal to
// its model's state, and a call that is not admitted (or a dry run)
// changes no key, nor does a policy that refused in shadow.
func TestPolicyRatesMatchModels(t *testing.T) {
	t.Parallel()
	runRateProperty(t, testenv.Redis(t), 20, 300)
}

// TestPolicyRatesMatchModelsCluster is the same on the 3-master cluster,
// the keys of a call under one hash tag.
func TestPolicyRatesMatchModelsCluster(t *testing.T) {
	t.Parallel()
	runRateProperty(t, testenv.Cluster(t), 6, 120)
}

func runRateProperty(t *testing.T, c redis.UniversalClient, schedules, steps int) {
	seed := propertySeed(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d: rerun with RATELIMIT_SEED=%d", seed, seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 0x9a7e5))
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	seen := map[string]int{}
	restored := 0

	for sch := range schedules {
		tenant := newTenant()
		var pols []*ratePolicy
		span, fine := int64(10_000), int64(math.MaxInt64)
		for i := range 1 + rng.IntN(4) {
			alg := rateAlgs[rng.IntN(len(rateAlgs))]
			if i == 0 {
				alg = rateAlgs[sch%len(rateAlgs)] // every algorithm in every run
			}
			p := newRatePolicy(rng, r.PolicyKey("t:"+tenant, fmt.Sprintf("p%d", i), "v"), alg)
			if i == 0 {
				p.units = sch/len(rateAlgs)%2 == 0 // and with weights
			}
			pols = append(pols, p)
			span = max(span, rateSpan(alg, p.spec.Params)/4)
			if alg == quota.AlgWarmUp {
				fine = min(fine, p.spec.Params[0])
			} else {
				fine = min(fine, p.spec.Params[1])
			}
		}
		now := at(t, propertyStarts[rng.IntN(len(propertyStarts))]).UnixMicro()
		var history []string
		var calls []rateCall
		fail := func(format string, args ...any) {
			t.Helper()
			var desc []string
			for _, p := range pols {
				desc = append(desc, fmt.Sprintf("%s how=%d units=%t %v", p.spec.Alg, p.spec.How, p.units, p.spec.Params))
			}
			t.Fatalf("seed %d schedule %d policies %s\nlast steps:\n  %s\n%s", seed, sch, strings.Join(desc, "; "),
				strings.Join(history[max(0, len(history)-10):], "\n  "), fmt.Sprintf(format, args...))
		}

		for i := range steps {
			// A gap: none (a burst), within the finest interval, or on the
			// scale of the states' spans. (Script time may run slower than
			// real time: rateKeepAlive keeps the keys from expiring in real
			// time before their state is empty in script time.)
			switch x := rng.IntN(10); {
			case x < 3:
			case x < 6:
				now += rng.Int64N(fine + 1)
			case x < 9:
				now += rng.Int64N(span + 1)
			default:
				now += rng.Int64N(4*span + 1)
			}
			if rng.IntN(25) == 0 {
				// the limits of a policy change; its key stays
				p := pols[rng.IntN(len(pols))]
				p.spec.Params = rateParams(rng, p.spec.Alg, p.spec.How)
				p.model.(interface{ Reparam(policyalg.Params) }).Reparam(p.spec.Params)
				history = append(history, fmt.Sprintf("%d new params of %s: %v", i, p.spec.Alg, p.spec.Params))
				continue
			}
			mode, id := PolicyAdmit, fmt.Sprintf("req-%d-%d", sch, i)
			var idx []int
			var specs []PolicySpec
			var models []policyalg.Model
			x := rng.IntN(100)
			switch {
			case x < 8 && len(calls) > 0:
				mode = PolicyUndo
				j := len(calls) - 1 - rng.IntN(min(3, len(calls)))
				call := calls[j]
				calls = append(calls[:j], calls[j+1:]...)
				id = call.id
				for n, k := range call.specs {
					s := pols[k].spec
					s.Weight = call.w[n]
					idx, specs, models = append(idx, k), append(specs, s), append(models, pols[k].model)
				}
			default:
				if x < 18 {
					mode = PolicyDry
				}
				cost := 1 + rng.Int64N(4)
				switch rng.IntN(15) {
				case 0:
					cost = 1 << 40 // the most a route costs: never but in a fast leaky bucket
				case 1:
					cost = 1<<50 + 1 // never, wherever it counts (a debt over 2^50 us)
				case 2:
					cost = 7
				}
				for k, p := range pols {
					if rng.IntN(5) == 0 && len(pols) > 1 {
						continue // not every policy matches every request
					}
					s := p.spec
					s.Weight = 1
					if p.units {
						s.Weight = cost
					}
					idx, specs, models = append(idx, k), append(specs, s), append(models, p.model)
				}
			}
			if len(specs) == 0 {
				continue
			}
			keys := make([]string, len(specs))
			for n, s := range specs {
				keys[n] = s.Key
			}
			for _, k := range idx {
				restored += rateKeepAlive(t, c, pols[k], now)
			}
			before := rateKeyState(t, c, keys)
			lo := rateRedisMS(t, c)
			got, err := r.RunPolicies(ctx, mode, now, id, specs)
			if err != nil {
				fail("step %d RunPolicies: %v", i, err)
			}
			hi := rateRedisMS(t, c)
			want := rateExpect(mode, now, id, specs, models)
			var ws []string
			for _, s := range specs {
				ws = append(ws, fmt.Sprintf("%s w=%d", s.Alg, s.Weight))
			}
			history = append(history, fmt.Sprintf("%d %s now=%d %s -> %s", i, mode, now, strings.Join(ws, ", "), rateFmt(want)))
			if g, w := rateFmt(got), rateFmt(want); g != w {
				fail("step %d %s:\n  got  %s\n  want %s", i, mode, g, w)
			}
			after := rateKeyState(t, c, keys)
			if mode != PolicyUndo {
				for n := range specs {
					if got.Items[n].Outcome == 1 && got.Allowed && mode == PolicyAdmit {
						continue
					}
					// (a key may expire meanwhile: its state is empty by
					// time, which rateCompareKey checks below)
					if before[n] != after[n] && after[n] != rateAbsent {
						fail("step %d %s: policy %d (outcome %d, allowed %t) changed its key: %s -> %s", i, mode, n, got.Items[n].Outcome, got.Allowed, before[n], after[n])
					}
				}
			}
			for n, k := range idx {
				if msg := rateCompareKey(t, c, pols[k], now); msg != "" {
					fail("step %d %s: %s", i, mode, msg)
				}
				if before[n] != after[n] && after[n] != rateAbsent {
					if msg := rateCheckExpiry(t, c, pols[k], now, lo, hi); msg != "" {
						fail("step %d %s: %s", i, mode, msg)
					}
				}
			}
			// what the schedules reached, to require every branch
			if mode == PolicyAdmit {
				call := rateCall{id: id}
				for n, it := range got.Items {
					alg := string(specs[n].Alg)
					switch {
					case it.Outcome == 1 && got.Allowed:
						seen[alg+" admitted"]++
						call.specs, call.w = append(call.specs, idx[n]), append(call.w, specs[n].Weight)
					case it.Outcome == 1:
						seen["admitted, refused elsewhere"]++
					case it.Retry == -1:
						seen[alg+" never"]++
					default:
						seen[alg+" refused"]++
					}
					if it.Delay > 0 {
						seen["delayed"]++
					}
				}
				if got.Allowed {
					calls = append(calls, call)
				}
			} else {
				seen[mode]++
			}
		}
		for _, p := range pols { // keep Redis small between schedules
			if err := c.Del(ctx, p.spec.Key).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("outcomes: %v", seen)
	if restored > 0 {
		t.Logf("%d keys expired in real time before their state was empty in script time (a loaded machine): restored", restored)
	}
	if schedules*steps >= 3000 {
		for _, alg := range rateAlgs {
			for _, o := range []string{" admitted", " refused", " never"} {
				if seen[string(alg)+o] == 0 {
					t.Errorf("no %q outcome in %d steps: the schedules no longer cover it", string(alg)+o, schedules*steps)
				}
			}
		}
		for _, o := range []string{"admitted, refused elsewhere", "delayed", PolicyUndo, PolicyDry} {
			if seen[o] == 0 {
				t.Errorf("no %q outcome in %d steps", o, schedules*steps)
			}
		}
	}
}

// TestPolicyRatesLimitChanges: a policy's limits change while its key
// holds state (the key is the policy's and stays): the script reads the
// state under the new limits as the model does. token_bucket and gcra clamp
// their time to the new limits; warm_up reads its stored permits as at most
// the new maxPermits (which counts when a request comes exactly at
// nextFree, without a resync) and a cooled-down limiter stays cold; the
// leaky bucket's queue drains at the rate it was written with.
func TestPolicyRatesLimitChanges(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	type step struct {
		after int64 // us after the previous step; -1: at the warm_up's nextFree
		p     policyalg.Params
		w     int64
		ok    bool // admitted
	}
	slow, fast := policyalg.Params{3, 10_000_000}, policyalg.Params{3, 1000}
	for _, tc := range []struct {
		alg   quota.Algorithm
		steps []step
	}{
		// the clamp: one interval of the new limits after the old debt
		{quota.AlgTokenBucket, []step{{0, slow, 3, true}, {0, fast, 1, false}, {1000, fast, 1, true},
			{0, slow, 1, true}, {5_000_000, slow, 1, true}}},
		{quota.AlgGCRA, []step{{0, slow, 1, true}, {0, slow, 1, true}, {0, fast, 1, false}, {1000, fast, 1, true},
			{0, slow, 1, true}}},
		// no clamp: the queue drains at the rate it was written with
		{quota.AlgLeakyBucket, []step{{0, policyalg.Params{2, 10_000_000, 0}, 1, true}, {0, policyalg.Params{2, 10_000_000, 0}, 2, true},
			{0, policyalg.Params{2, 1000, 0}, 1, false}, {25_000_000, policyalg.Params{2, 1000, 0}, 1, false},
			{5_000_000, policyalg.Params{2, 1000, 0}, 1, true}}},
		{quota.AlgWarmUp, []step{{0, policyalg.Params{100_000, 3_000_000, 3}, 1, true},
			{-1, policyalg.Params{100_000, 1_000_000, 3}, 1, true}, // 29 permits stored, at most 10 now
			{-1, policyalg.Params{100_000, 1_000_000, 3}, 1, true},
			{10_000_000, policyalg.Params{100_000, 3_000_000, 3}, 1, true}, // cooled down: cold under any limits
		}},
	} {
		key := r.PolicyKey("t:"+newTenant(), string(tc.alg), "v")
		pol := &ratePolicy{spec: PolicySpec{Key: key, Alg: tc.alg, Params: tc.steps[0].p}}
		pol.model, _ = policyalg.New(tc.alg, tc.steps[0].p)
		now := at(t, "2031-05-15T12:00:00Z").UnixMicro()
		for i, st := range tc.steps {
			if st.after < 0 {
				now = pol.model.(*policyalg.WarmUp).NextFree
			} else {
				now += st.after
			}
			pol.spec.Params = st.p
			pol.model.(interface{ Reparam(policyalg.Params) }).Reparam(st.p)
			spec := pol.spec
			spec.Weight = st.w
			got, err := r.RunPolicies(ctx, PolicyAdmit, now, fmt.Sprint(i), []PolicySpec{spec})
			if err != nil {
				t.Fatal(err)
			}
			want := rateExpect(PolicyAdmit, now, fmt.Sprint(i), []PolicySpec{spec}, []policyalg.Model{pol.model})
			if g, w := rateFmt(got), rateFmt(want); g != w {
				t.Fatalf("%s step %d %v:\n  got  %s\n  want %s", tc.alg, i, st.p, g, w)
			}
			if msg := rateCompareKey(t, c, pol, now); msg != "" {
				t.Fatalf("%s step %d: %s", tc.alg, i, msg)
			}
			if got.Allowed != st.ok {
				t.Fatalf("%s step %d: admitted %t, want %t", tc.alg, i, got.Allowed, st.ok)
			}
		}
	}
}

// TestPolicyRatesExactUnderConcurrency: 64 goroutines on a pool of 64
// connections admit on one key at one explicit now until refused: exactly
// burst (gcra), capacity (token_bucket), burst+1 (leaky_bucket) and 1
// (warm_up: the next one pays its price) pass, each remaining count once.
func TestPolicyRatesExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	opts, err := redisdb.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opts.PoolSize = 64
	c, err := redisdb.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	r, _ := mustRunner(t, c)
	now := at(t, "2031-05-15T12:00:00Z").UnixMicro()
	tenant := newTenant()
	for _, tc := range []struct {
		alg    quota.Algorithm
		params policyalg.Params
		want   int64
	}{
		{quota.AlgGCRA, policyalg.Params{500, 1_000_000}, 500},
		{quota.AlgTokenBucket, policyalg.Params{700, 1_000_000}, 700},
		{quota.AlgLeakyBucket, policyalg.Params{300, 1_000_000, 0}, 301},
		{quota.AlgWarmUp, policyalg.Params{100_000, 1_000_000, 3}, 1},
	} {
		spec := PolicySpec{Key: r.PolicyKey("t:"+tenant, string(tc.alg), "v"), Alg: tc.alg, Weight: 1, Params: tc.params}
		var (
			mu        sync.Mutex
			admitted  int64
			remaining = map[int64]int{}
			wg        sync.WaitGroup
			start     = make(chan struct{})
		)
		for g := range 64 {
			wg.Go(func() {
				<-start
				for n := 0; ; n++ {
					res, err := r.RunPolicies(context.Background(), PolicyAdmit, now, fmt.Sprintf("g%d-%d", g, n), []PolicySpec{spec})
					if err != nil {
						t.Errorf("%s: %v", tc.alg, err)
						return
					}
					if !res.Allowed {
						return
					}
					mu.Lock()
					admitted++
					remaining[res.Items[0].Remaining]++
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		if admitted != tc.want {
			t.Errorf("%s %v: %d admitted at one now, want %d", tc.alg, tc.params, admitted, tc.want)
		}
		if tc.alg == quota.AlgWarmUp {
			continue
		}
		for n := range tc.want {
			if remaining[n] != 1 {
				t.Errorf("%s: remaining %d reported %d times, want once", tc.alg, n, remaining[n])
			}
		}
	}
}

// TestPolicyRatesKeysExpire: every key written gets an expiry of when its
// state is empty again (rounded up to the ms) + 1 s, relative to the
// script's now (an explicit now far in the past or the future included),
// and an undo that empties the state deletes the key.
func TestPolicyRatesKeysExpire(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	const slackMS = 1000
	redisMS := func() int64 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.UnixMilli()
	}
	for _, start := range []int64{
		at(t, "2001-01-01T00:00:00Z").UnixMicro(),
		at(t, "2031-05-15T12:00:00Z").UnixMicro(),
	} {
		tenant := newTenant()
		for _, tc := range []struct {
			alg    quota.Algorithm
			params policyalg.Params
			w      int64
		}{
			{quota.AlgTokenBucket, policyalg.Params{8, 2_000_000}, 2},
			{quota.AlgGCRA, policyalg.Params{4, 3_000_000}, 1},
			{quota.AlgLeakyBucket, policyalg.Params{3, 2_500_000, 4_000_000}, 1},
			{quota.AlgWarmUp, policyalg.Params{250_000, 2_000_000, 3}, 1},
		} {
			m, err := policyalg.New(tc.alg, tc.params)
			if err != nil {
				t.Fatal(err)
			}
			spec := PolicySpec{Key: r.PolicyKey("t:"+tenant, string(tc.alg), "v"), Alg: tc.alg, Weight: tc.w, Params: tc.params}
			need := func() int64 {
				n, _ := rateModelKey(m)
				return n
			}
			// expiry checks the key's absolute expiry against Redis's clock
			// read before and after the call that set it.
			expiry := func(what string, now, lo, hi int64) {
				t.Helper()
				ttl := (need()-now+999)/1000 + slackMS
				d, err := c.PExpireTime(ctx, spec.Key).Result()
				if err != nil {
					t.Fatal(err)
				}
				got := d.Milliseconds()
				if got < lo+ttl || got > hi+ttl+1 {
					t.Errorf("%s %s at %d: expires at %d ms, want %d ms after the call (between %d and %d)",
						tc.alg, what, now, got, ttl, lo+ttl, hi+ttl+1)
				}
			}
			now := start
			for i := range 3 {
				lo := redisMS()
				if _, err := r.RunPolicies(ctx, PolicyAdmit, now, "x"+strconv.Itoa(i), []PolicySpec{spec}); err != nil {
					t.Fatal(err)
				}
				if want := rateExpect(PolicyAdmit, now, "", []PolicySpec{spec}, []policyalg.Model{m}); !want.Allowed {
					t.Fatalf("%s: step %d refused", tc.alg, i)
				}
				expiry(fmt.Sprintf("admission %d", i), now, lo, redisMS())
				if i < 2 {
					now += 700_000
				}
			}
			// an undo that leaves state shortens the expiry
			lo := redisMS()
			if _, err := r.RunPolicies(ctx, PolicyUndo, now, "x2", []PolicySpec{spec}); err != nil {
				t.Fatal(err)
			}
			m.Undo(now, spec.Weight, "x2")
			if need() <= now {
				t.Fatalf("%s: the undo emptied the state: the test no longer checks the expiry it shortened", tc.alg)
			}
			expiry("undo", now, lo, redisMS())
			// undos past the state's end delete the key
			now = need() + 1
			for range 3 {
				if _, err := r.RunPolicies(ctx, PolicyUndo, now, "x1", []PolicySpec{spec}); err != nil {
					t.Fatal(err)
				}
			}
			if n, err := c.Exists(ctx, spec.Key).Result(); err != nil || n != 0 {
				t.Errorf("%s: the key outlives an undo that emptied it (exists %d, %v)", tc.alg, n, err)
			}
			// a dry run writes nothing: no key
			if _, err := r.RunPolicies(ctx, PolicyDry, now, "d", []PolicySpec{spec}); err != nil {
				t.Fatal(err)
			}
			if n, _ := c.Exists(ctx, spec.Key).Result(); n != 0 {
				t.Errorf("%s: a dry run wrote the key", tc.alg)
			}
		}
	}
}

// TestPolicyRatesWarmUpGuavaTrace runs Guava's testWarmUp trace (see
// policyalg's TestWarmUpGuavaTrace) through the script: each request comes
// back after its Retry and waits 0, 1.375 s, 1.125 s, 0.875 s, 0.625 s,
// then 0.5 s.
func TestPolicyRatesWarmUpGuavaTrace(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	r, _ := mustRunner(t, c)
	ctx := context.Background()
	spec := PolicySpec{Key: r.PolicyKey("t:"+newTenant(), "w", "v"), Alg: quota.AlgWarmUp, Weight: 1,
		Params: policyalg.Params{500_000, 4_000_000, 3}}
	now := at(t, "2031-05-15T12:00:00Z").UnixMicro()
	var waits []int64
	for range 8 {
		res, err := r.RunPolicies(ctx, PolicyAdmit, now, "x", []PolicySpec{spec})
		if err != nil {
			t.Fatal(err)
		}
		var wait int64
		if !res.Allowed {
			wait = res.Retry
			now += wait
			if res, err = r.RunPolicies(ctx, PolicyAdmit, now, "x", []PolicySpec{spec}); err != nil || !res.Allowed {
				t.Fatalf("refused after its retry: %v %s", err, rateFmt(res))
			}
		}
		waits = append(waits, wait)
	}
	if got, want := fmt.Sprint(waits), "[0 1375000 1125000 875000 625000 500000 500000 500000]"; got != want {
		t.Fatalf("waits %s, want %s", got, want)
	}
}

// benchPolicy admits on one key with Redis time, params that never refuse,
// and reports us per RunPolicies decision and the key's MEMORY USAGE at
// steady state.
func benchPolicy(b *testing.B, alg quota.Algorithm, p policyalg.Params) {
	c := testenv.Redis(b)
	r, _ := mustRunner(b, c)
	ctx := context.Background()
	spec := PolicySpec{Key: r.PolicyKey("t:"+newTenant(), string(alg), "v"), Alg: alg, Weight: 1, Params: p}
	specs := []PolicySpec{spec}
	b.ReportAllocs()
	refused := 0
	for b.Loop() {
		res, err := r.RunPolicies(ctx, PolicyAdmit, 0, "bench", specs)
		if err != nil {
			b.Fatal(err)
		}
		if !res.Allowed {
			refused++
		}
	}
	if refused > b.N/100 {
		b.Fatalf("%d of %d refused: not the write path", refused, b.N)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e3, "µs/decision")
	bytes, err := c.MemoryUsage(ctx, spec.Key, 0).Result()
	if err != nil {
		b.Fatalf("MEMORY USAGE: %v", err)
	}
	b.ReportMetric(float64(bytes), "bytes/key")
}

func BenchmarkPolicy_token_bucket(b *testing.B) {
	benchPolicy(b, quota.AlgTokenBucket, policyalg.Params{1 << 30, 1})
}

func BenchmarkPolicy_gcra(b *testing.B) {
	benchPolicy(b, quota.AlgGCRA, policyalg.Params{1 << 30, 1})
}

func BenchmarkPolicy_leaky_bucket(b *testing.B) {
	benchPolicy(b, quota.AlgLeakyBucket, policyalg.Params{1 << 30, 1, 0})
}

func BenchmarkPolicy_warm_up(b *testing.B) {
	benchPolicy(b, quota.AlgWarmUp, policyalg.Params{1, 1_000_000, 3})
}
