package billing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// The tiers of TestPrepaidNeverOwes: two postpaid (one billing overage,
// the tier's and a meter's, one blocking), two prepaid at different
// prices (one with a billed meter quota).
var propertyTiers = []quota.Tier{
	{Slug: "basic", Name: "Basic", Rank: 4401, PriceCents: 30,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(5))}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000,
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(2)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 3000}}},
	{Slug: "block", Name: "Block", Rank: 4402, PriceCents: 20,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(8))}, Overage: quota.OverageBlock},
	{Slug: "payg", Name: "Pay as you go", Rank: 4403,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(3))}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 1000,
		MeterQuotas: []quota.MeterQuota{{Meter: "search", MonthlyQuota: quota.Ptr(int64(1)), Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000}},
		Billing:     quota.BillingPrepaid, TopUpURL: "https://example.com/top-up"},
	{Slug: "payg2", Name: "Pay as you go, dear", Rank: 4404,
		Limits: quota.Limits{MonthlyQuota: quota.Ptr(int64(0))}, Overage: quota.OverageBill, OveragePriceCentsPer1K: 2000,
		Billing: quota.BillingPrepaid, TopUpURL: "https://example.com/top-up"},
}

// TestPrepaidNeverOwes is a property test against real Redis and
// Postgres: random sequences of plan moves (postpaid and prepaid, at a
// period's start and in its middle), credits (with and without expiry,
// some expiring exactly at a period's end, some granted in an invoice's
// grace), admissions (until refused, on a prepaid tier), on the default
// calendar and an anchored one in New York, then the worker's cycle
// finalizing every period. Whatever the sequence:
//
//   - an invoice owes only for what admission did not draw: a final
//     invoice owes nothing when a request drew credit after the last move
//     of its period (its charges from before were known to the balance
//     then, and none came after);
//   - a credit pays only invoices of periods it was valid at the end of,
//     and never more than its amount in all.
func TestPrepaidNeverOwes(t *testing.T) {
	t.Parallel()
	seeds := 16
	if testing.Short() {
		seeds = 4
	}
	for seed := range seeds {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			t.Parallel()
			runPrepaidProperty(t, uint64(seed))
		})
	}
}

// propertyEvent is one step of a sequence, at its time.
type propertyEvent struct {
	at   time.Time
	kind string // "move", "credit", "admit", "step"
	tier string
	// credit
	cents   int64
	expires *time.Time
	// admit
	meter string
	n     int
}

func runPrepaidProperty(t *testing.T, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 22))
	cal := quota.Calendar{}
	if seed%3 == 2 {
		cal = quota.Tenant{BillingAnchorDay: 15, TimeZone: "America/New_York"}.Calendar()
	}
	first, _ := cal.Period(time.Date(2031, 4, 20, 0, 0, 0, 0, time.UTC))
	var bounds []time.Time // period starts, and the last one's end
	for at := first; len(bounds) < 5; {
		bounds = append(bounds, at)
		_, at = cal.Period(at)
	}
	tiers := slices.Clone(propertyTiers)
	start := tiers[rnd.IntN(len(tiers))]
	tiers = slices.DeleteFunc(tiers, func(tr quota.Tier) bool { return tr.Slug == start.Slug })
	w := newPrepaidWorld(t, first, append([]quota.Tier{start}, tiers...)...)
	if !cal.IsDefault() {
		invExec(t, w.r.db, `UPDATE tenants SET billing_anchor_day = 15, time_zone = 'America/New_York' WHERE id = $1`, w.tenant)
		w.cal = cal
	}
	slugs := []string{"basic", "block", "payg", "payg2"}

	var events []propertyEvent
	for k := range len(bounds) - 1 {
		ps, pe := bounds[k], bounds[k+1]
		if k > 0 {
			events = append(events, propertyEvent{at: ps.Add(time.Minute), kind: "step"}) // the period's first flush
			if rnd.IntN(3) == 0 {
				events = append(events, propertyEvent{at: ps, kind: "move", tier: slugs[rnd.IntN(len(slugs))]})
			}
			events = append(events, propertyEvent{at: ps.Add(2 * time.Hour), kind: "step"}) // the previous invoice final
		}
		for range 4 + rnd.IntN(4) {
			e := propertyEvent{at: ps.Add(2*time.Minute + time.Duration(rnd.Int64N(int64(pe.Sub(ps)-3*time.Minute))))}
			if rnd.IntN(3) == 0 { // in the previous invoice's grace
				e.at = ps.Add(2*time.Minute + time.Duration(rnd.IntN(50))*time.Minute)
			}
			e.at = e.at.Truncate(time.Second)
			switch r := rnd.IntN(20); {
			case r < 5:
				e.kind, e.tier = "move", slugs[rnd.IntN(len(slugs))]
			case r < 9:
				e.kind, e.cents = "credit", int64(5+rnd.IntN(56))
				switch rnd.IntN(5) {
				case 0, 1: // never expires
				case 2: // at a period's end, this one's or the next
					x := bounds[min(k+1+rnd.IntN(2), len(bounds)-1)]
					e.expires = &x
				default:
					x := e.at.Add(time.Hour + time.Duration(rnd.Int64N(int64(70*24*time.Hour)))).Truncate(time.Second)
					e.expires = &x
				}
			case r < 19:
				e.kind, e.meter, e.n = "admit", []string{"demo", "demo", "search"}[rnd.IntN(3)], 1+rnd.IntN(12)
			default:
				e.kind = "step"
			}
			events = append(events, e)
		}
	}
	end := bounds[len(bounds)-1]
	events = append(events, propertyEvent{at: end.Add(2 * time.Hour), kind: "step"})
	slices.SortStableFunc(events, func(a, b propertyEvent) int { return a.at.Compare(b.at) })

	// drew[k] says whether a request drew credit in period k after the
	// period's last move.
	drew := map[int]bool{}
	periodOf := func(at time.Time) int { // the index of at's period in bounds
		k := 0
		for k+1 < len(bounds) && !at.Before(bounds[k+1]) {
			k++
		}
		return k
	}
	var log strings.Builder
	fmt.Fprintf(&log, "calendar %v, starts on %s\n", cal, w.tier)
	for _, e := range events {
		w.set(e.at)
		switch e.kind {
		case "move":
			if e.tier == w.tier {
				continue
			}
			w.move(e.tier)
			drew[periodOf(e.at)] = false
			w.step() // the admission of before the move is in the ledger a flush later
			fmt.Fprintf(&log, "%s move to %s\n", e.at.Format(time.RFC3339), e.tier)
		case "credit":
			w.credit(e.cents, e.expires)
			fmt.Fprintf(&log, "%s credit %d expiring %v\n", e.at.Format(time.RFC3339), e.cents, e.expires)
		case "admit":
			n := e.n
			if w.tiers[w.tier].IsPrepaid() {
				n = 500 // until refused
			}
			got, drawn := w.admitDrawing(e.meter, n)
			if drawn {
				drew[periodOf(e.at)] = true
			}
			fmt.Fprintf(&log, "%s admit %s on %s: %d of %d (drew: %v)\n", e.at.Format(time.RFC3339), e.meter, w.tier, got, n, drawn)
		case "step":
			w.step()
		}
	}

	invs, err := w.ledger.TenantInvoices(context.Background(), w.tenant)
	if err != nil {
		t.Fatal(err)
	}
	invs = slices.DeleteFunc(invs, func(in Invoice) bool { return !in.PeriodStart.Before(end) }) // the next period's draft
	if len(invs) != len(bounds)-1 {
		t.Fatalf("%d invoices, want %d\n%s", len(invs), len(bounds)-1, log.String())
	}
	for _, in := range invs {
		k := periodOf(in.PeriodStart)
		if in.Status != "final" {
			t.Errorf("%s's invoice is %s, want final", in.Period, in.Status)
		}
		if in.TotalCents > 0 && drew[k] {
			t.Errorf("%s's invoice owes %d cents, though a request drew credit after its last move\nlines %+v\n%s", in.Period, in.TotalCents, in.Lines, log.String())
		}
	}
	rows, err := w.r.db.Query(context.Background(), `
		SELECT c.id::text, c.amount_cents, c.drawn_cents, coalesce(sum(d.amount_cents), 0)::bigint,
		       count(*) FILTER (WHERE NOT (c.created_at < i.period_end AND (c.expires_at IS NULL OR c.expires_at >= i.period_end)))
		FROM credits c LEFT JOIN credit_draws d ON d.credit_id = c.id LEFT JOIN invoices i ON i.id = d.invoice_id
		WHERE c.tenant_id = $1 GROUP BY c.id`, w.tenant)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var amount, drawn, draws, invalid int64
		if err := rows.Scan(&id, &amount, &drawn, &draws, &invalid); err != nil {
			t.Fatal(err)
		}
		if drawn != draws || draws > amount || invalid > 0 {
			t.Errorf("credit %s of %d cents: drawn %d, draws %d, %d on invoices of periods it was not valid at the end of", id, amount, drawn, draws, invalid)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}
