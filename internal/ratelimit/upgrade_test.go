package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// The rolling upgrade from the release before the Function library (main
// 8e98851: scripts sent with EVALSHA, the state in the v2 layout by
// default). Its nodes and this release's run side by side on the same
// keys, so this release must continue from every key the released scripts
// write exactly as they would have. testdata/upgrade/released.json holds
// such keys, written by the released code (TestGenerateUpgradeFixture,
// run on that release: testdata/upgrade/README.md says how), and what the
// released code made of them in the steps below; TestUpgradeFromRelease
// loads the keys and holds this release to the same answers and keys.
//
// This file compiles against the released code too (it uses only what
// both have), so that the fixture and the test share one scenario.

const upgradeFixturePath = "testdata/upgrade/released.json"

// upgradeKey is one key of a snapshot: a hash's fields or a string's
// value, and its expiry (PEXPIRETIME ms) when it is set in script time
// (the scenario's explicit times, years ahead of the real clock), or
// relativeExpiry when it is set from the real clock (a TTL: the settle
// entry, the pending and flushing hashes), or -1 for none.
type upgradeKey struct {
	Type     string            `json:"type"`
	Fields   map[string]string `json:"fields,omitempty"`
	Value    string            `json:"value,omitempty"`
	ExpireAt int64             `json:"expire_at_ms"`
}

const relativeExpiry = 0

// upgradeSnapshot holds a tenant's keys by name, the prefix left out and
// the tenant id written @ ("v2:{t:@}").
type upgradeSnapshot map[string]upgradeKey

type upgradeStep struct {
	Name   string          `json:"name"`
	Result string          `json:"result"`
	After  upgradeSnapshot `json:"after"`
}

// upgradeRefund is the decision of the previous period's request that the
// refund step gives back.
type upgradeRefund struct {
	NowUS, Overage, MeterOverage int64
}

type upgradeTenant struct {
	Name   string          `json:"name"`
	Refund upgradeRefund   `json:"refund"`
	Before upgradeSnapshot `json:"before"`
	Steps  []upgradeStep   `json:"steps"`
}

type upgradeFixture struct {
	MadeBy  string          `json:"made_by"`
	Tenants []upgradeTenant `json:"tenants"`
}

// upgradeScenario is one tenant of the fixture: its calendar, a time in
// the previous billing period (prev) and one in the current (cur).
type upgradeScenario struct {
	name      string
	cal       quota.Calendar
	prev, cur time.Time
	balance   int64 // prepaid balance of cur's period, millicents
}

func upgradeScenarios(tb testing.TB) []upgradeScenario {
	return []upgradeScenario{
		// the spend cap bites first
		{name: "utc", prev: at(tb, "2031-04-20T10:00:00Z"), cur: at(tb, "2031-05-02T10:00:00Z"), balance: 10_000_000},
		// a billing calendar; the prepaid credit bites first
		{name: "calendar", cal: mustCalendar(tb, "America/New_York", 15),
			prev: at(tb, "2031-05-10T14:00:00Z"), cur: at(tb, "2031-05-16T14:00:00Z"), balance: 25_000},
	}
}

// request is the scenario's request of cost on meter at now: a bill tier
// with a tight monthly quota and spend cap, a billed meter quota on
// "search", burst limits, and a prepaid credit.
func (s upgradeScenario) request(tenant, meter string, cost int64, now time.Time) quota.Request {
	pp := &quota.Prepaid{BalanceMillicents: 10_000_000, PeriodID: s.cal.PeriodID(now), Lines: 2,
		ExpiringMillicents: 1 << 53}
	if s.cal.PeriodID(now) == s.cal.PeriodID(s.cur) {
		pp.BalanceMillicents, pp.PrevID = s.balance, s.cal.PeriodID(s.prev)
	}
	return quota.Request{TenantID: tenant, Meter: meter, Cost: cost, Now: now, Calendar: s.cal,
		Limits: quota.Limits{BurstRate: f64(10), Burst: i64(20), BucketCapacity: i64(500), BucketRefillPerSec: f64(50),
			DailyQuota: i64(1000), MonthlyQuota: i64(50), MaxOverageCents: i64(40)},
		Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: i64(10), Overage: quota.OverageBill,
			OveragePriceCentsPer1K: 3000}},
		Prepaid: pp}
}

// build writes the scenario's state with the code under test (the released
// code, for the fixture): the previous period's usage, grants and credit
// draws, then the current period's, which rolls the month (w, the meter's
// "|w", '$w', P's previous period), a refusal, a deny-cache refusal and a
// settle entry. It returns the previous period's request the refund step
// gives back.
func (s upgradeScenario) build(tb testing.TB, r *stack, tenant string) upgradeRefund {
	tb.Helper()
	ctx := context.Background()
	admit := func(meter string, cost int64, now time.Time) quota.Decision {
		tb.Helper()
		return mustAdmit(tb, r, s.request(tenant, meter, cost, now))
	}
	grant := func(id, period string, units int64, now time.Time) {
		tb.Helper()
		// (an id, and the period of now: r.grant takes explicit times, where
		// ApplyGrant takes Redis's)
		if ok, err := r.grant(ctx, tenant, s.cal, id, period, time.Time{}, units, now); err != nil || !ok {
			tb.Fatalf("grant %s: %t, %v", id, ok, err)
		}
	}
	admit("demo", 30, s.prev)
	admit("demo", 25, s.prev.Add(time.Minute)) // 5 units past the monthly quota
	admit("search", 8, s.prev.Add(2*time.Minute))
	refund := admit("search", 8, s.prev.Add(3*time.Minute)) // past both monthly quotas
	if refund.MeterOverageUnits == 0 {
		tb.Fatalf("the previous period's search request has no meter overage: %s", fmtDecision(refund))
	}
	grant("g-prev", "month", 5, s.prev.Add(4*time.Minute))
	admit("demo", 10, s.cur)
	admit("search", 8, s.cur.Add(time.Minute))
	admit("search", 8, s.cur.Add(2*time.Minute))
	grant("g-month", "month", 7, s.cur.Add(3*time.Minute))
	grant("g-day", "day", 3, s.cur.Add(3*time.Minute))
	if d := admit("demo", 2000, s.cur.Add(4*time.Minute)); d.Allowed {
		tb.Fatalf("a request past the daily quota was admitted: %s", fmtDecision(d))
	}
	if err := r.CountRefused(ctx, []quota.RefusalCount{{TenantID: tenant, Meter: "demo", Hour: s.cur, Requests: 2}}); err != nil {
		tb.Fatal(err)
	}
	req := s.request(tenant, "demo", 4, s.cur.Add(5*time.Minute))
	if err := r.Reserve(ctx, "rq-upgrade", req, mustAdmit(tb, r, req)); err != nil {
		tb.Fatal(err)
	}
	return upgradeRefund{NowUS: refund.Now.UnixMicro(), Overage: refund.OverageUnits, MeterOverage: refund.MeterOverageUnits}
}

// steps runs the steps that follow the upgrade on the state build wrote,
// calling each with its name and result.
func (s upgradeScenario) steps(tb testing.TB, r *stack, tenant string, refund upgradeRefund, each func(name, result string)) {
	tb.Helper()
	ctx := context.Background()
	// the next admissions: counters, grants, overage, the spend cap and the
	// credit continue from the state, until one of them refuses
	var b strings.Builder
	for i := range 12 {
		meter := []string{"demo", "search"}[i%2]
		d := mustAdmit(tb, r, s.request(tenant, meter, 4, s.cur.Add(time.Hour+time.Duration(i)*time.Second)))
		fmt.Fprintf(&b, "%s meter_overage=%d\n", fmtDecision(d), d.MeterOverageUnits)
	}
	each("admit", b.String())

	// a refund of the previous period's request: its month, its meter's
	// month, its millicents and its credit draws, after the roll
	prev := time.UnixMicro(refund.NowUS)
	err := r.RefundRequest(ctx, s.request(tenant, "search", 8, prev),
		quota.Decision{Now: prev, OverageUnits: refund.Overage, MeterOverageUnits: refund.MeterOverage})
	each("refund", fmt.Sprint(err))

	// a settlement of the request the released code reserved
	st, err := r.Settle(ctx, tenant, "rq-upgrade", 40)
	each("settle", fmt.Sprintf("%+v %v", st, err))

	// the worker's flush: the pending usage of both hashes, once
	b.Reset()
	for range 2 {
		batches, err := r.Claim(ctx, []string{tenant}, nil)
		fmt.Fprintf(&b, "claim: %d batches, %v\n", len(batches), err)
		for _, bt := range batches {
			fmt.Fprintf(&b, "resumed=%t err=%v\n", bt.Resumed, bt.Err)
			for _, row := range bt.Rows {
				fmt.Fprintf(&b, "%+v\n", row)
			}
		}
		fmt.Fprintf(&b, "finish: %v\n", r.Finish(ctx, batches))
	}
	each("claim", b.String())
}

// snapshotUpgrade reads the tenant's keys under prefix.
func snapshotUpgrade(tb testing.TB, c redis.UniversalClient, prefix, tenant string) upgradeSnapshot {
	tb.Helper()
	ctx := context.Background()
	tag := "{t:" + tenant + "}"
	// the scenario's script times are in 2031; a TTL from the real clock
	// ends long before (until the real clock nears 2031, as other tests'
	// dates do)
	ahead := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	snap := upgradeSnapshot{}
	for _, k := range mustKeys(tb, c, prefix) {
		if !strings.Contains(k, tag) {
			continue
		}
		var v upgradeKey
		var err error
		switch v.Type, err = c.Type(ctx, k).Result(); {
		case err != nil:
		case v.Type == "hash":
			v.Fields, err = c.HGetAll(ctx, k).Result()
		case v.Type == "string":
			v.Value, err = c.Get(ctx, k).Result()
		default:
			err = fmt.Errorf("type %s", v.Type)
		}
		if err == nil {
			var at time.Duration // (go-redis answers PEXPIRETIME as a Duration, -1 as -1)
			at, err = c.PExpireTime(ctx, k).Result()
			v.ExpireAt = int64(at)
			if at > 0 {
				v.ExpireAt = at.Milliseconds()
			}
		}
		if err != nil {
			tb.Fatalf("%s: %v", k, err)
		}
		if v.ExpireAt > 0 && v.ExpireAt < ahead {
			v.ExpireAt = relativeExpiry
		}
		snap[strings.Replace(strings.TrimPrefix(k, prefix+":"), tag, "{t:@}", 1)] = v
	}
	return snap
}

// restoreUpgrade writes snap's keys for tenant under prefix; a relative
// expiry gets the longest such TTL (the pending hash's).
func restoreUpgrade(tb testing.TB, c redis.UniversalClient, prefix, tenant string, snap upgradeSnapshot) {
	tb.Helper()
	ctx := context.Background()
	for name, v := range snap {
		k := prefix + ":" + strings.Replace(name, "{t:@}", "{t:"+tenant+"}", 1)
		var err error
		switch v.Type {
		case "hash":
			err = c.HSet(ctx, k, v.Fields).Err()
		case "string":
			err = c.Set(ctx, k, v.Value, 0).Err()
		default:
			err = fmt.Errorf("type %s", v.Type)
		}
		if err == nil && v.ExpireAt == relativeExpiry {
			err = c.Expire(ctx, k, 14*24*time.Hour).Err()
		} else if err == nil && v.ExpireAt > 0 {
			err = c.PExpireAt(ctx, k, time.UnixMilli(v.ExpireAt)).Err()
		}
		if err != nil {
			tb.Fatalf("restore %s: %v", k, err)
		}
	}
}

// diffSnapshots describes how got differs from want, key by key ("" when
// they are the same).
func diffSnapshots(got, want upgradeSnapshot) string {
	var diffs []string
	for name, w := range want {
		g, ok := got[name]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: missing, want %+v", name, w))
		case fmt.Sprint(g) != fmt.Sprint(w):
			diffs = append(diffs, fmt.Sprintf("%s:\n  got  %+v\n  want %+v", name, g, w))
		}
	}
	for name, g := range got {
		if _, ok := want[name]; !ok {
			diffs = append(diffs, fmt.Sprintf("%s: unexpected %+v", name, g))
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "\n")
}

// addedByThisRelease checks, then takes out of got, what this release
// writes on purpose beside what the released code wrote after a step: the
// claim marks the tenant's state hash with the sequence it claimed ("lc",
// lua/claim.lua), Redis' clock in microseconds.
func addedByThisRelease(t *testing.T, step string, got upgradeSnapshot) {
	t.Helper()
	if step != "claim" {
		return
	}
	state, ok := got["v2:{t:@}"]
	lc, marked := state.Fields["lc"]
	seq, err := strconv.ParseInt(lc, 10, 64)
	if !ok || !marked || err != nil || time.Since(time.UnixMicro(seq)).Abs() > time.Minute {
		t.Errorf("claim: the state hash's mark lc = %q (present %t), want the sequence claimed, Redis' clock in µs", lc, marked)
		return
	}
	delete(state.Fields, "lc")
}

// TestUpgradeFromRelease loads the keys the released scripts wrote
// (testdata/upgrade/released.json) and holds this release to what the
// released code made of them: the next admissions (counters, grants,
// overage, the spend cap's and the credit's money, and the refusals they
// come to), a refund of a request of the month before (after the roll:
// the month before's counters, its meter's, its millicents and its credit
// draws), the settlement of an entry the released code reserved, and the
// worker's claim, which flushes the pending usage of both hashes once.
// Every answer and every key (fields and script-time expiries) must be
// the released code's, but for what this release adds on purpose
// (addedByThisRelease).
func TestUpgradeFromRelease(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(upgradeFixturePath)
	if err != nil {
		t.Fatal(err)
	}
	var fx upgradeFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	scenarios := upgradeScenarios(t)
	if len(fx.Tenants) != len(scenarios) {
		t.Fatalf("the fixture has %d tenants, the scenarios %d", len(fx.Tenants), len(scenarios))
	}
	for i, s := range scenarios {
		want := fx.Tenants[i]
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			c := testenv.Redis(t)
			r, prefix := mustRunner(t, c)
			tenant := newTenant()
			restoreUpgrade(t, c, prefix, tenant, want.Before)
			if d := diffSnapshots(snapshotUpgrade(t, c, prefix, tenant), want.Before); d != "" {
				t.Fatalf("the fixture's keys did not load as they were:\n%s", d)
			}
			var n int
			s.steps(t, r, tenant, want.Refund, func(name, result string) {
				if n >= len(want.Steps) || want.Steps[n].Name != name {
					t.Fatalf("step %d %s: not in the fixture", n, name)
				}
				w := want.Steps[n]
				n++
				if result != w.Result {
					t.Errorf("%s: the released code answered\n%s\nthis release\n%s", name, w.Result, result)
				}
				got := snapshotUpgrade(t, c, prefix, tenant)
				addedByThisRelease(t, name, got)
				if d := diffSnapshots(got, w.After); d != "" {
					t.Errorf("%s: the keys differ from the released code's:\n%s", name, d)
				}
			})
			if n != len(want.Steps) {
				t.Errorf("ran %d steps, the fixture has %d", n, len(want.Steps))
			}
		})
	}
}

// TestGenerateUpgradeFixture writes testdata/upgrade/released.json when
// TOLLGATE_UPGRADE_FIXTURE names the file to write; it is meant to run on
// the released code (testdata/upgrade/README.md).
func TestGenerateUpgradeFixture(t *testing.T) {
	out := os.Getenv("TOLLGATE_UPGRADE_FIXTURE")
	if out == "" {
		t.Skip("TOLLGATE_UPGRADE_FIXTURE is not set")
	}
	c := testenv.Redis(t)
	r, prefix := mustRunner(t, c)
	fx := upgradeFixture{MadeBy: os.Getenv("TOLLGATE_UPGRADE_FIXTURE_FROM")}
	for _, s := range upgradeScenarios(t) {
		tenant := newTenant()
		ut := upgradeTenant{Name: s.name, Refund: s.build(t, r, tenant)}
		ut.Before = snapshotUpgrade(t, c, prefix, tenant)
		s.steps(t, r, tenant, ut.Refund, func(name, result string) {
			ut.Steps = append(ut.Steps, upgradeStep{Name: name, Result: result, After: snapshotUpgrade(t, c, prefix, tenant)})
		})
		fx.Tenants = append(fx.Tenants, ut)
	}
	raw, err := json.MarshalIndent(fx, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, append(raw, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}
