package billing

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/golang-migrate/migrate/v4"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Anchored calendars of the tests. New York is UTC-4 (EDT) until
// 2026-11-01 06:00 UTC, then UTC-5 (EST): its day of 2026-11-01 has 25
// hours. Kathmandu is UTC+5:45 all year.
var (
	anchSep    = time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	anchOct    = time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)
	anchNYOct  = time.Date(2026, 10, 15, 4, 0, 0, 0, time.UTC)   // 2026-10-15 00:00 EDT
	anchNYNov  = time.Date(2026, 11, 15, 5, 0, 0, 0, time.UTC)   // 2026-11-15 00:00 EST
	anchNYDec  = time.Date(2026, 12, 15, 5, 0, 0, 0, time.UTC)   // 2026-12-15 00:00 EST
	anchNYSecs = int64(31*86400 + 3600)                          // Oct 15 – Nov 15: 31 days and the hour of Nov 1
	anchKtmNov = time.Date(2026, 10, 31, 18, 15, 0, 0, time.UTC) // 2026-11-01 00:00 +05:45
	anchKtmDec = time.Date(2026, 11, 30, 18, 15, 0, 0, time.UTC) // 2026-12-01 00:00 +05:45
)

// invCalendar gives the tenant a billing calendar, as PATCH does.
func invCalendar(tb testing.TB, db *pgxpool.Pool, tenantID string, anchor int, zone string) {
	tb.Helper()
	invExec(tb, db, `UPDATE tenants SET billing_anchor_day = $2, time_zone = $3 WHERE id = $1`, tenantID, anchor, zone)
}

func mustZone(tb testing.TB, name string) *time.Location {
	tb.Helper()
	loc, err := quota.LoadZone(name)
	if err != nil {
		tb.Fatal(err)
	}
	return loc
}

func invCheckPeriod(tb testing.TB, got Invoice, label string, start, end time.Time, status string) {
	tb.Helper()
	if got.Period != label || !got.PeriodStart.Equal(start) || !got.PeriodEnd.Equal(end) || got.Status != status {
		tb.Errorf("invoice: got %s [%v, %v) %s, want %s [%v, %v) %s", got.Period, got.PeriodStart, got.PeriodEnd, got.Status,
			label, start, end, status)
	}
}

func TestPeriodOfLabel(t *testing.T) {
	t.Parallel()
	// Every label's period starts where the one before ends, and is
	// labelled by it: periods tile time, one per label.
	for _, zone := range []string{"UTC", "America/New_York", "Asia/Kathmandu", "Asia/Kolkata", "Pacific/Chatham",
		"Pacific/Auckland", "Australia/Lord_Howe", "America/Santiago", "Asia/Beirut", "Europe/London", "Pacific/Kiritimati"} {
		for _, anchor := range []int{1, 2, 15, 28} {
			cal := quota.Calendar{AnchorDay: anchor, Zone: mustZone(t, zone)}
			for l := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC); l.Year() < 2029; l = l.AddDate(0, 1, 0) {
				start, end := periodOf(cal, l)
				next, _ := periodOf(cal, l.AddDate(0, 1, 0))
				if !end.Equal(next) || !start.Before(end) {
					t.Fatalf("%s anchor %d, %s: [%v, %v), next starts %v", zone, anchor, l.Format("2006-01"), start, end, next)
				}
				if got := labelOf(cal, start); !got.Equal(l) {
					t.Fatalf("%s anchor %d: label of %v: got %v, want %v", zone, anchor, start, got, l)
				}
				if got := labelOf(cal, end.Add(-time.Second)); !got.Equal(l) {
					t.Fatalf("%s anchor %d: label of %v: got %v, want %v", zone, anchor, end.Add(-time.Second), got, l)
				}
				if s, e := cal.Period(start); !s.Equal(start) || !e.Equal(end) {
					t.Fatalf("%s anchor %d: Period(%v) = [%v, %v), want [%v, %v)", zone, anchor, start, s, e, start, end)
				}
			}
		}
	}
	tests := []struct {
		name       string
		cal        quota.Calendar
		label      time.Time
		start, end time.Time
	}{
		{"default", quota.Calendar{}, invNov, invNov, invDec},
		{"New York, 15th, across the end of DST", quota.Calendar{AnchorDay: 15, Zone: mustZone(t, "America/New_York")}, anchOct, anchNYOct, anchNYNov},
		{"New York, 15th, across its start (2027-03-14)", quota.Calendar{AnchorDay: 15, Zone: mustZone(t, "America/New_York")},
			time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 2, 15, 5, 0, 0, 0, time.UTC), time.Date(2027, 3, 15, 4, 0, 0, 0, time.UTC)},
		{"Kathmandu, 1st", quota.Calendar{AnchorDay: 1, Zone: mustZone(t, "Asia/Kathmandu")}, invNov, anchKtmNov, anchKtmDec},
		{"Auckland, 1st: starts in the UTC month before", quota.Calendar{AnchorDay: 1, Zone: mustZone(t, "Pacific/Auckland")}, invNov,
			time.Date(2026, 10, 31, 11, 0, 0, 0, time.UTC), time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start, end := periodOf(tt.cal, tt.label)
			if !start.Equal(tt.start) || !end.Equal(tt.end) {
				t.Errorf("got [%v, %v), want [%v, %v)", start, end, tt.start, tt.end)
			}
		})
	}
}

// TestAnchoredInvoiceNewYork rates New York, anchor 15: the period labelled
// 2026-10 runs from 2026-10-15 04:00 UTC to 2026-11-15 05:00 UTC, 31 days
// and the extra hour of 2026-11-01 (2,682,000 s).
func TestAnchoredInvoiceNewYork(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := &invClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	inv := NewInvoicer(db, clock.Now, 6*time.Hour)

	full := invTenant(t, db, "pro", anchSep)
	invCalendar(t, db, full, 15, "America/New_York")
	invUsage(t, db, full, anchNYOct.Add(-time.Hour), 7, 0)                       // 2026-10-14 23:00 EDT: September's
	invUsage(t, db, full, anchNYOct, 100, 0)                                     // 2026-10-15 00:00 EDT
	invUsage(t, db, full, time.Date(2026, 11, 1, 5, 0, 0, 0, time.UTC), 1000, 0) // 01:00 EDT
	invUsage(t, db, full, time.Date(2026, 11, 1, 6, 0, 0, 0, time.UTC), 1000, 0) // 01:00 EST, the hour again
	invUsage(t, db, full, anchNYNov.Add(-time.Hour), 20, 0)                      // 2026-11-14 23:00 EST, 04:00 UTC
	invUsage(t, db, full, anchNYNov, 3000, 0)                                    // 2026-11-15 00:00 EST, 05:00 UTC: November's
	invGrant(t, db, full, "month", time.Date(2026, 10, 15, 0, 0, 0, 0, time.UTC), 500)
	invGrant(t, db, full, "day", time.Date(2026, 11, 14, 0, 0, 0, 0, time.UTC), 30)
	invGrant(t, db, full, "day", time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), 40) // November's

	// Upgraded at 2026-11-01 00:00 EDT (04:00 UTC), before the extra hour:
	// 17 days (1,468,800 s) of Pro, 14 days and an hour (1,213,200 s) of
	// Enterprise, each prorated over the period's 2,682,000 s.
	upgraded := invTenant(t, db, "pro", anchSep)
	invCalendar(t, db, upgraded, 15, "America/New_York")
	invChangeTier(t, db, upgraded, "enterprise", time.Date(2026, 11, 1, 4, 0, 0, 0, time.UTC))

	got := invGenerate(t, inv, full, anchOct)
	invCheckPeriod(t, got, "2026-10", anchNYOct, anchNYNov, "final")
	invCheckLines(t, got, []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2026-10-15 – 2026-11-15 (31.0 of 31 days)", Quantity: anchNYSecs, AmountCents: 4900},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month", Quantity: 100 + 2000 + 20},
		{Kind: "grant", Description: "Grant: 500 extra units for the period from 2026-10-15 (not charged)", Quantity: 500},
		{Kind: "grant", Description: "Grant: 30 extra units for 2026-11-14 (not charged)", Quantity: 30},
	})

	got = invGenerate(t, inv, full, invNov)
	invCheckPeriod(t, got, "2026-11", anchNYNov, anchNYDec, "draft")
	invCheckLines(t, got, []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2026-11-15 – 2026-12-15 (30.0 of 30 days)", Quantity: 30 * 86400, AmountCents: 4900},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month", Quantity: 3000},
		{Kind: "grant", Description: "Grant: 40 extra units for 2026-11-15 (not charged)", Quantity: 40},
	})

	got = invGenerate(t, inv, full, anchSep) // 2026-09-15 04:00 UTC – 2026-10-15 04:00 UTC
	invCheckPeriod(t, got, "2026-09", time.Date(2026, 9, 15, 4, 0, 0, 0, time.UTC), anchNYOct, "final")
	if got.Lines[1].Quantity != 7 {
		t.Errorf("September's usage: got %d, want 7", got.Lines[1].Quantity)
	}

	got = invGenerate(t, inv, upgraded, anchOct)
	invCheckLines(t, got, []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2026-10-15 – 2026-11-01 (17.0 of 31 days)", Quantity: 1_468_800,
			AmountCents: 2683}, // 4900 × 1,468,800 / 2,682,000 = 2683.49
		{Kind: "subscription", Description: "Enterprise plan, 2026-11-01 – 2026-11-15 (14.0 of 31 days)", Quantity: 1_213_200,
			AmountCents: 22572}, // 49900 × 1,213,200 / 2,682,000 = 22572.21
		{Kind: "included", Description: "Usage, included in Enterprise plan: 20,000,000 units per month"},
	})

	// A label whose period has not started has no invoice; nor has one the
	// tenant did not live in.
	clock.Set(time.Date(2026, 12, 15, 4, 59, 59, 0, time.UTC))
	if _, err := inv.Generate(context.Background(), full, invDec); quota.ErrorCode(err) != quota.CodeInvalid {
		t.Errorf("December before 2026-12-15 00:00 EST: got %v, want %s", err, quota.CodeInvalid)
	}
	late := invTenant(t, db, "pro", anchNYNov)
	invCalendar(t, db, late, 15, "America/New_York")
	if _, err := inv.Generate(context.Background(), late, anchOct); quota.ErrorCode(err) != quota.CodeNotFound {
		t.Errorf("a tenant created at its October period's end: got %v, want %s", err, quota.CodeNotFound)
	}
}

// TestAnchoredInvoiceShortPeriod: New York's period labelled 2027-02
// runs from 2027-02-15 05:00 UTC to 2027-03-15 04:00 UTC, across the
// 23-hour day of 2027-03-14: 28 days less an hour, 2,415,600 s. A whole
// period costs the full price; parts are prorated over its true length.
func TestAnchoredInvoiceShortPeriod(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	inv := NewInvoicer(db, (&invClock{t: time.Date(2027, 4, 1, 0, 0, 0, 0, time.UTC)}).Now, 6*time.Hour)
	feb := time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)
	start, end := time.Date(2027, 2, 15, 5, 0, 0, 0, time.UTC), time.Date(2027, 3, 15, 4, 0, 0, 0, time.UTC)
	whole := invTenant(t, db, "pro", feb)
	invCalendar(t, db, whole, 15, "America/New_York")
	got := invGenerate(t, inv, whole, feb)
	invCheckPeriod(t, got, "2027-02", start, end, "final")
	invCheckLines(t, got, []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2027-02-15 – 2027-03-15 (28.0 of 28 days)", Quantity: 2_415_600, AmountCents: 4900},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month"},
	})

	// Upgraded at 2027-03-01 00:00 EST (05:00 UTC): 14 days (1,209,600 s)
	// of Pro, 13 days 23 hours (1,206,000 s) of Enterprise.
	upgraded := invTenant(t, db, "pro", feb)
	invCalendar(t, db, upgraded, 15, "America/New_York")
	invChangeTier(t, db, upgraded, "enterprise", time.Date(2027, 3, 1, 5, 0, 0, 0, time.UTC))
	invCheckLines(t, invGenerate(t, inv, upgraded, feb), []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2027-02-15 – 2027-03-01 (14.0 of 28 days)", Quantity: 1_209_600,
			AmountCents: 2454}, // 4900 × 1,209,600 / 2,415,600 = 2453.65
		{Kind: "subscription", Description: "Enterprise plan, 2027-03-01 – 2027-03-15 (14.0 of 28 days)", Quantity: 1_206_000,
			AmountCents: 24913}, // 49900 × 1,206,000 / 2,415,600 = 24912.82
		{Kind: "included", Description: "Usage, included in Enterprise plan: 20,000,000 units per month"},
	})
}

// TestAnchoredInvoiceKathmandu: a period boundary at 18:15 UTC cuts an
// hour bucket, which counts in the period its start is in.
func TestAnchoredInvoiceKathmandu(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	clock := &invClock{t: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)}
	inv := NewInvoicer(db, clock.Now, 6*time.Hour)
	id := invTenant(t, db, "pro", anchSep)
	invCalendar(t, db, id, 1, "Asia/Kathmandu")
	invUsage(t, db, id, anchKtmNov.Add(-15*time.Minute), 11, 0)  // 18:00 UTC: the bucket starts in October's period
	invUsage(t, db, id, anchKtmNov.Add(45*time.Minute), 200, 0)  // 19:00 UTC
	invUsage(t, db, id, anchKtmDec.Add(-15*time.Minute), 300, 0) // 18:00 UTC on Nov 30: still November's
	invUsage(t, db, id, anchKtmDec.Add(45*time.Minute), 4000, 0) // December's
	invGrant(t, db, id, "month", invNov, 600)

	got := invGenerate(t, inv, id, invNov)
	invCheckPeriod(t, got, "2026-11", anchKtmNov, anchKtmDec, "final")
	invCheckLines(t, got, []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2026-11-01 – 2026-12-01 (30.0 of 30 days)", Quantity: 30 * 86400, AmountCents: 4900},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month", Quantity: 500},
		{Kind: "grant", Description: "Grant: 600 extra units for November 2026 (not charged)", Quantity: 600},
	})
	for _, c := range []struct {
		label  time.Time
		units  int64
		status string
	}{{anchOct, 11, "final"}, {invDec, 4000, "draft"}} {
		got := invGenerate(t, inv, id, c.label)
		if got.Lines[1].Quantity != c.units || got.Status != c.status {
			t.Errorf("%s: got %d units, %s; want %d, %s", got.Period, got.Lines[1].Quantity, got.Status, c.units, c.status)
		}
	}
}

// TestAnchoredInvoiceCredits: a credit pays the invoice of a period it is
// valid at the end of, the tenant's own period end.
func TestAnchoredInvoiceCredits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	clock := &invClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	inv := NewInvoicer(db, clock.Now, 6*time.Hour)
	anchored := invTenant(t, db, "pro", anchSep)
	invCalendar(t, db, anchored, 15, "America/New_York")
	def := invTenant(t, db, "pro", anchSep)
	inside := anchNYNov.Add(-time.Second) // expires inside the anchored period, after the default one
	for _, id := range []string{anchored, def} {
		mustCredit(t, db, id, 1000, "Expires inside", &inside, anchOct)
	}
	mustCredit(t, db, anchored, 300, "Expires at the end", &anchNYNov, anchOct)
	mustCredit(t, db, anchored, 200, "Created at the end", nil, anchNYNov)

	got := invGenerate(t, inv, anchored, anchOct)
	invCheckPeriod(t, got, "2026-10", anchNYOct, anchNYNov, "final")
	invCheckLines(t, got, []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2026-10-15 – 2026-11-15 (31.0 of 31 days)", Quantity: anchNYSecs, AmountCents: 4900},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month"},
		{Kind: "credit", Description: "Credit: Expires at the end", Quantity: 1, AmountCents: -300},
	}) // 4900 - 300 = 4600
	var drawn int64
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(amount_cents), 0) FROM credit_draws WHERE invoice_id = $1`, got.ID).Scan(&drawn); err != nil || drawn != 300 {
		t.Errorf("drawn on the final invoice: %d (%v), want 300", drawn, err)
	}

	// The default calendar's October ends on Nov 1: the credit is valid
	// then. 4900 - 1000 = 3900.
	if got := invGenerate(t, inv, def, anchOct); got.TotalCents != 3900 || !got.PeriodEnd.Equal(invNov) {
		t.Errorf("default October: total %d, end %v; want 3900, %v", got.TotalCents, got.PeriodEnd, invNov)
	}

	// November's draft (ends Dec 15) shows the credit made at its start.
	invCheckLines(t, invGenerate(t, inv, anchored, invNov), []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2026-11-15 – 2026-12-15 (30.0 of 30 days)", Quantity: 30 * 86400, AmountCents: 4900},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month"},
		{Kind: "credit", Description: "Credit: Created at the end", Quantity: 1, AmountCents: -200},
	}) // 4700
}

// TestRunFinalizesAnchored drives Invoicer.Run on an injected clock: an
// anchored tenant's invoice stays a draft until its own period's end plus
// the grace (and the flushes have reached that end), while a default
// tenant's closes with the month, as before.
func TestRunFinalizesAnchored(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	const grace = 6 * time.Hour
	clock := &invClock{}
	flushed := &invClock{}
	inv := NewInvoicer(db, clock.Now, grace)
	inv.FlushedThrough = flushed.Now

	def := invTenant(t, db, "pro", anchOct)
	anchored := invTenant(t, db, "pro", anchSep)
	invCalendar(t, db, anchored, 15, "America/New_York")

	status := func(tenantID string, label time.Time) (string, *time.Time) {
		t.Helper()
		var s string
		var fin *time.Time
		err := db.QueryRow(ctx, `SELECT status, finalized_at FROM invoices WHERE tenant_id = $1 AND period = $2`, tenantID, label).Scan(&s, &fin)
		if err != nil {
			return "none", nil
		}
		return s, fin
	}
	run := func(at time.Time) {
		t.Helper()
		clock.Set(at)
		flushed.Set(at)
		if err := inv.Run(ctx); err != nil {
			t.Fatalf("Run at %v: %v", at, err)
		}
	}
	want := func(tenantID string, label time.Time, wantStatus string) {
		t.Helper()
		if got, _ := status(tenantID, label); got != wantStatus {
			t.Errorf("at %v, %s's %s: got %s, want %s", clock.Now(), tenantID[:8], label.Format("2006-01"), got, wantStatus)
		}
	}

	run(time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC))
	want(def, anchOct, "final")
	want(def, invNov, "draft")
	want(anchored, anchOct, "draft") // its October runs to Nov 15
	want(anchored, invNov, "none")   // not started

	// Created half an hour before its period ends, never seen by a sweep
	// before that end.
	late := invTenant(t, db, "pro", anchNYNov.Add(-30*time.Minute))
	invCalendar(t, db, late, 15, "America/New_York")

	run(anchNYNov.Add(grace - time.Second))
	want(anchored, anchOct, "draft")
	want(anchored, invNov, "draft")
	want(late, anchOct, "draft")
	invUsage(t, db, anchored, anchNYNov.Add(-time.Hour), 5000, 0) // flushed late, before its close

	// The flushes lag: the period's usage may not all be in.
	clock.Set(anchNYNov.Add(grace))
	flushed.Set(anchNYNov.Add(-time.Minute))
	if err := inv.Run(ctx); err != nil {
		t.Fatal(err)
	}
	want(anchored, anchOct, "draft")

	finalAt := anchNYNov.Add(grace + time.Minute)
	run(finalAt)
	for _, id := range []string{anchored, late} {
		if got, fin := status(id, anchOct); got != "final" || fin == nil || !fin.Equal(finalAt) {
			t.Errorf("%s's October after its end + grace: got %s at %v, want final at %v", id[:8], got, fin, finalAt)
		}
	}
	want(anchored, invNov, "draft")
	want(def, invNov, "draft")
	if got := invGenerate(t, inv, anchored, anchOct); got.Lines[1].Quantity != 5000 {
		t.Errorf("the late usage: got %d units, want 5000", got.Lines[1].Quantity)
	}
	// 30 minutes of Pro: 4900 × 1,800 / 2,682,000 = 3.29.
	invCheckLines(t, invGenerate(t, inv, late, anchOct), []InvoiceLine{
		{Kind: "subscription", Description: "Pro plan, 2026-11-14 23:30 – 2026-11-15 (0.0 of 31 days)", Quantity: 1800, AmountCents: 3},
		{Kind: "included", Description: "Usage, included in Pro plan: 1,000,000 units per month"},
	})

	run(invDec.Add(grace))
	want(def, invNov, "final")
	want(anchored, invNov, "draft") // runs to Dec 15 05:00 UTC
	want(anchored, invDec, "none")

	run(anchNYDec.Add(grace))
	want(anchored, invNov, "final")
	want(anchored, invDec, "draft")
	want(def, invDec, "draft")
}

// TestRunSplitsDueDraftsByOwner: with Owns, a Run finalizes the due drafts
// of the tenants it owns only, resuming its listing where its budget
// stopped it; another with the other tenants finalizes the rest.
func TestRunSplitsDueDraftsByOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	const grace = time.Hour
	clock := &invClock{}
	var ids []string
	for range 12 {
		id := invTenant(t, db, "pro", anchSep)
		invCalendar(t, db, id, 15, "America/New_York")
		ids = append(ids, id)
	}
	// a owns the last 4 in id order, the order of the listings: a Run of
	// a (1 tenant a Run, so 8 listed) that did not resume where the one
	// before stopped would list b's 8 drafts again, and never reach its own.
	slices.Sort(ids)
	mine := func(id string) bool { return slices.Index(ids, id) >= 8 }
	invoicer := func(owns func(string) bool) *Invoicer {
		inv := NewInvoicer(db, clock.Now, grace)
		inv.Owns, inv.TenantsPerRun = owns, 1
		return inv
	}
	a, b := invoicer(mine), invoicer(func(id string) bool { return !mine(id) })
	// Closing October (on Nov 10) leaves their Octobers drafts, which run
	// to Nov 15; from then on closeDue finalizes them.
	clock.Set(time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC))
	for range 12 {
		for _, inv := range []*Invoicer{a, b} {
			if err := inv.Run(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	var drafts int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM invoices WHERE period = $1 AND status = 'draft'`, anchOct).Scan(&drafts); err != nil {
		t.Fatal(err)
	}
	if drafts != len(ids) || !a.closedThrough.Equal(anchOct) || !b.closedThrough.Equal(anchOct) {
		t.Fatalf("after October closed: %d drafts, closed through %v and %v; want %d, October", drafts, a.closedThrough, b.closedThrough, len(ids))
	}
	final := func() map[string]bool { return invoicedTenants(t, db, anchOct, "final") }
	if got := final(); len(got) != 0 {
		t.Fatalf("before their periods end: %d final, want none", len(got))
	}
	clock.Set(anchNYNov.Add(grace))
	// a's first Run lists b's 8 drafts; each of the next four, resuming
	// past them, finalizes one of a's.
	for run := range 5 {
		if err := a.Run(ctx); err != nil {
			t.Fatal(err)
		}
		got := final()
		if len(got) != run {
			t.Fatalf("after a's Run %d: %d final, want %d", run+1, len(got), run)
		}
		for id := range got {
			if !mine(id) {
				t.Fatalf("after a's Run %d: tenant %s, which a does not own, is final", run+1, id)
			}
		}
	}
	for range 8 {
		if err := b.Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := final(); len(got) != len(ids) {
		t.Fatalf("after b's Runs: %d final, want all %d", len(got), len(ids))
	}
}

// TestRunClosesMonthsPastOthersDrafts: a worker catching up two months
// (nobody closed September in October) closes its tenants' September,
// then their October, although the other workers' September drafts keep
// September listed: it does not walk September again in the same pass.
func TestRunClosesMonthsPastOthersDrafts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	clock := &invClock{}
	var ids []string
	for range 12 {
		ids = append(ids, invTenant(t, db, "pro", time.Date(2026, 8, 15, 0, 0, 0, 0, time.UTC)))
	}
	slices.Sort(ids)
	mine := func(id string) bool { return slices.Index(ids, id) >= 8 } // the last 4 in the listings' order
	clock.Set(time.Date(2026, 9, 10, 0, 0, 0, 0, time.UTC))
	if err := NewInvoicer(db, clock.Now, time.Hour).Run(ctx); err != nil { // September's drafts
		t.Fatal(err)
	}
	a := NewInvoicer(db, clock.Now, time.Hour)
	a.Owns, a.TenantsPerRun = mine, 1
	clock.Set(time.Date(2026, 11, 10, 0, 0, 0, 0, time.UTC))
	for range 20 {
		if err := a.Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, month := range []time.Time{anchSep, anchOct} {
		final := slices.Sorted(maps.Keys(invoicedTenants(t, db, month, "final")))
		if !slices.Equal(final, ids[8:]) {
			t.Errorf("%s: final invoices of %d tenants %v, want a's 4 %v", month.Format("2006-01"), len(final), final, ids[8:])
		}
	}
}

// TestInvoicePeriodsMigration: down from 000012 drops the bounds and keeps
// the invoices and an anchored month grant; up again gives every invoice
// its label's UTC month, and a writer that names no bounds gets them too.
func TestInvoicePeriodsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, m := migratablePool(t)
	id := invTenant(t, db, "pro", anchSep)
	invCalendar(t, db, id, 15, "America/New_York")
	invGrant(t, db, id, "month", time.Date(2026, 10, 15, 0, 0, 0, 0, time.UTC), 5)
	inv := invGenerate(t, NewInvoicer(db, (&invClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}).Now, time.Hour), id, anchOct)
	invCheckPeriod(t, inv, "2026-10", anchNYOct, anchNYNov, "final")

	if err := m.Migrate(11); err != nil {
		t.Fatalf("down to 11: %v", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'invoices' AND column_name LIKE 'period_%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("after down: %d period_ columns (%v), want none", n, err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO grants (tenant_id, period, period_start, units) VALUES ($1, 'month', '2026-11-15', 1)`, id); err == nil {
		t.Error("after down: a month grant on the 15th was accepted")
	}
	for range 2 { // up, then up again: no change
		if err := m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
			t.Fatalf("up again: %v", err)
		}
	}
	if err := pgdb.SchemaCurrent(ctx, db); err != nil {
		t.Fatal(err)
	}
	got := invGenerate(t, NewInvoicer(db, (&invClock{t: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}).Now, time.Hour), id, anchOct)
	invCheckPeriod(t, got, "2026-10", anchOct, invNov, "final") // final: never regenerated, it keeps the filled bounds
	if got.TotalCents != inv.TotalCents {
		t.Errorf("final total after down and up: %d, want %d", got.TotalCents, inv.TotalCents)
	}
	other := invTenant(t, db, "pro", anchSep)
	invExec(t, db, `INSERT INTO invoices (tenant_id, period) VALUES ($1, '2026-11-01')`, other)
	var start, end time.Time
	if err := db.QueryRow(ctx, `SELECT period_start, period_end FROM invoices WHERE tenant_id = $1`, other).Scan(&start, &end); err != nil ||
		!start.Equal(invNov) || !end.Equal(invDec) {
		t.Errorf("an invoice inserted without bounds: [%v, %v) (%v), want [%v, %v)", start, end, err, invNov, invDec)
	}
}

// TestRunMixedCalendarsConcurrent runs four invoicers and two refreshes at
// once over tenants of four calendars, at an instant when each calendar
// has a period to close (through closeMonth, closeDue or the sweep's
// previous period) and one to draft, every tenant with a credit: no
// deadlock, one final invoice per tenant drawing its credit once, one
// draft of its current period.
func TestRunMixedCalendarsConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	const n = 400
	invExec(t, db, `INSERT INTO tenants (name, tier, webhook_secret, created_at, billing_anchor_day, time_zone)
		SELECT 'tenant ' || g, 'pro', decode(repeat('ab', 32), 'hex'), $2,
		       CASE g % 4 WHEN 1 THEN 15 ELSE 1 END,
		       (ARRAY['UTC', 'America/New_York', 'Asia/Kathmandu', 'Pacific/Auckland'])[g % 4 + 1]
		FROM generate_series(1, $1) g`, n, anchSep)
	invExec(t, db, `INSERT INTO tenant_tier_history (tenant_id, tier, valid_from) SELECT id, tier, created_at FROM tenants`)
	invExec(t, db, `INSERT INTO credits (tenant_id, amount_cents, reason, created_at) SELECT id, 100, 'Welcome', $1 FROM tenants`, anchSep)
	rows, err := db.Query(ctx, `SELECT id::text FROM tenants ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}

	// Dec 1 02:00 UTC, grace 1 h: the default and Auckland's and
	// Kathmandu's Novembers are over; New York's October (to Nov 15) was
	// never drafted, its November runs to Dec 15.
	clock := &invClock{t: time.Date(2026, 12, 1, 2, 0, 0, 0, time.UTC)}
	var invs []*Invoicer
	for range 4 {
		inv := NewInvoicer(db, clock.Now, time.Hour)
		inv.batch = 70
		invs = append(invs, inv)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(invs)+2)
	for k, inv := range invs {
		wg.Go(func() { errs[k] = inv.Run(ctx) })
	}
	for k := range 2 {
		wg.Go(func() { errs[len(invs)+k] = invs[k].Refresh(ctx, ids) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	type summary struct{ Finals, Drafts, FinalTotal, Draws, Drawn int64 }
	sum := func() summary {
		t.Helper()
		var s summary
		err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'final'), count(*) FILTER (WHERE status = 'draft'),
			coalesce(sum(total_cents) FILTER (WHERE status = 'final'), 0)::bigint,
			(SELECT count(*) FROM credit_draws), (SELECT coalesce(sum(drawn_cents), 0)::bigint FROM credits) FROM invoices`).
			Scan(&s.Finals, &s.Drafts, &s.FinalTotal, &s.Draws, &s.Drawn)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	want := summary{Finals: n, Drafts: n, FinalTotal: n * (4900 - 100), Draws: n, Drawn: n * 100}
	if got := sum(); got != want {
		t.Fatalf("after concurrent Runs: got %+v, want %+v", got, want)
	}
	var wrong int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM invoices i JOIN tenants t ON t.id = i.tenant_id
		WHERE i.status = 'final' AND i.period <> CASE t.time_zone WHEN 'America/New_York' THEN '2026-10-01'::date ELSE '2026-11-01'::date END`).
		Scan(&wrong); err != nil || wrong != 0 {
		t.Errorf("%d final invoices of another label than their calendar's last period (%v)", wrong, err)
	}
	clock.Set(clock.Now().Add(time.Hour))
	if err := NewInvoicer(db, clock.Now, time.Hour).Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sum(); got != want {
		t.Fatalf("after another Run: got %+v, want %+v", got, want)
	}
}
