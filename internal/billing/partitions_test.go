package billing

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tollgate/tollgate/internal/testenv"
)

// partitionsOf lists usage's partitions by name, the default's included.
func partitionsOf(t *testing.T, db *pgxpool.Pool) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'usage'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

func countRows(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestPartitionsCreatesTheComingMonthsAndTakesTheirRowsFromTheDefault: Run
// creates the partitions of the current month and the next PartitionsAhead
// months; rows written before (in usage_default) move into their month's
// partition, none lost; a second Run the same hour, and one an hour later,
// change nothing.
func TestPartitionsCreatesTheComingMonthsAndTakesTheirRowsFromTheDefault(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	clock := &invClock{t: time.Date(2030, 5, 15, 10, 30, 0, 0, time.UTC)}
	a := invTenant(t, db, "pro", time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC))
	june := time.Date(2030, 6, 1, 0, 0, 0, 0, time.UTC)
	for h := range 30 {
		invUsage(t, db, a, june.Add(time.Duration(h)*time.Hour), 10, 0)
	}
	invUsage(t, db, a, june.AddDate(0, 3, 0), 7, 0) // September: no partition made for it yet
	if n := countRows(t, db, `SELECT count(*) FROM usage_default`); n != 31 {
		t.Fatalf("usage_default holds %d rows before Run, want 31", n)
	}

	p := NewPartitions(db, clock.Now, 0)
	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	parts := partitionsOf(t, db)
	for _, want := range []string{"usage_p203005", "usage_p203006", "usage_p203007"} {
		if !slices.Contains(parts, want) {
			t.Errorf("no %s after Run (partitions: %v)", want, parts)
		}
	}
	if slices.Contains(parts, "usage_p203008") {
		t.Errorf("usage_p203008 made: more than %d months ahead (%v)", PartitionsAhead, parts)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage_p203006`); n != 30 {
		t.Errorf("usage_p203006 holds %d rows, want June's 30", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage_default`); n != 1 {
		t.Errorf("usage_default holds %d rows, want only September's", n)
	}
	if n := countRows(t, db, `SELECT sum(units) FROM usage WHERE tenant_id = $1`, a); n != 307 {
		t.Errorf("the tenant's units: %d, want 307", n)
	}
	// The partition made by Run takes the flush's upserts like any.
	invUsage(t, db, a, june, 5, 0)
	if n := countRows(t, db, `SELECT units FROM usage WHERE tenant_id = $1 AND hour = $2`, a, june); n != 15 {
		t.Errorf("upsert into the new partition: %d units, want 15", n)
	}

	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	clock.Set(clock.Now().Add(time.Hour))
	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if again := partitionsOf(t, db); !slices.Equal(again, parts) {
		t.Errorf("partitions after more Runs: %v, want %v", again, parts)
	}
	// Ensure on September moves its row out of the default.
	if err := p.Ensure(ctx, june.AddDate(0, 3, 14)); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage_default`); n != 0 {
		t.Errorf("usage_default holds %d rows after Ensure(September), want 0", n)
	}
	if n := countRows(t, db, `SELECT sum(units) FROM usage_p203009`); n != 7 {
		t.Errorf("usage_p203009 holds %d units, want 7", n)
	}
}

// TestPartitionsRetentionRollsUpThenDropsOldDetail: with a retention of 3
// months, Run at May 2030 keeps the hourly detail from February on, and
// rolls January (a partition) and December (in the default) up into
// usage_monthly before dropping them: totals, /v1/usage's reader and the
// invoice of the old month are the same as before; the kept months keep
// their hourly rows.
func TestPartitionsRetentionRollsUpThenDropsOldDetail(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	clock := &invClock{t: time.Date(2030, 5, 15, 10, 30, 0, 0, time.UTC)}
	dec := time.Date(2029, 12, 1, 0, 0, 0, 0, time.UTC)
	jan, feb := dec.AddDate(0, 1, 0), dec.AddDate(0, 2, 0)
	a := invTenant(t, db, "pro", time.Date(2029, 11, 1, 0, 0, 0, 0, time.UTC))
	b := invTenant(t, db, "free", time.Date(2029, 11, 1, 0, 0, 0, 0, time.UTC))
	p := NewPartitions(db, clock.Now, 3)
	if err := p.Ensure(ctx, jan); err != nil {
		t.Fatal(err)
	}
	if err := p.Ensure(ctx, feb); err != nil {
		t.Fatal(err)
	}
	// January: 12 hours of 100,000 units for a (the last two past the
	// quota of 1,000,000), on two meters; a few for b. December: in the
	// default. February: kept.
	for h := range 12 {
		at := jan.Add(time.Duration(24*h+3) * time.Hour)
		var over int64
		if h >= 10 {
			over = 100_000
		}
		invUsage(t, db, a, at, 100_000, over)
		invExec(t, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests, rejected, shadow_refused, degraded)
			VALUES ($1, $2, 'gpu', 3, 4, 1, 2, 1)`, a, at)
		invUsage(t, db, b, at, 9, 0)
	}
	invUsage(t, db, a, dec.Add(5*time.Hour), 40, 0)
	invUsage(t, db, a, dec.Add(29*time.Hour), 2, 0)
	for h := range 5 {
		invUsage(t, db, a, feb.Add(time.Duration(h)*time.Hour), 1, 0)
	}

	led := NewLedger(db)
	span := func() map[string]Totals {
		t.Helper()
		got, err := led.TenantTotals(ctx, []string{a, b}, dec, feb.AddDate(0, 1, 0))
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	days := func(from, to time.Time) []UsageRow {
		t.Helper()
		var out []UsageRow
		if err := led.EachUsage(ctx, a, from, to, "day", "", func(r UsageRow) error { out = append(out, r); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	inv := NewInvoicer(db, clock.Now, 100*365*24*time.Hour) // drafts for ever: regenerated each time
	before := span()
	janInvoice := invGenerate(t, inv, a, jan)
	if janInvoice.TotalCents <= 4900 {
		t.Fatalf("January's invoice: %d cents, want the subscription plus overage (lines %+v)", janInvoice.TotalCents, janInvoice.Lines)
	}
	janDays := days(jan, feb)
	var janUnits, janGPU int64
	for _, r := range janDays {
		janUnits += r.Units
		if r.Meter == "gpu" {
			janGPU += r.Requests
		}
	}

	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	parts := partitionsOf(t, db)
	if slices.Contains(parts, "usage_p203001") {
		t.Errorf("usage_p203001 kept past a 3-month retention: %v", parts)
	}
	if !slices.Contains(parts, "usage_p203002") {
		t.Errorf("usage_p203002 dropped within the retention: %v", parts)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage WHERE hour < $1`, feb); n != 0 {
		t.Errorf("%d hourly rows before February left", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage WHERE hour >= $1`, feb); n != 5 {
		t.Errorf("%d hourly rows of February on, want 5", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage_monthly`); n != 4 {
		t.Errorf("usage_monthly holds %d rows, want 4 (a's December demo, a's January demo and gpu, b's January demo)", n)
	}
	if n := countRows(t, db, `SELECT overage_units FROM usage_monthly WHERE tenant_id = $1 AND month = $2 AND meter = 'demo'`, a, jan); n != 200_000 {
		t.Errorf("January's rolled-up overage: %d, want 200000", n)
	}

	if after := span(); after[a] != before[a] || after[b] != before[b] || len(after) != 2 {
		t.Errorf("totals over December to February after the drop: %+v, want %+v", after, before)
	}
	got := days(jan, feb)
	var units, gpu int64
	for _, r := range got {
		units += r.Units
		if r.Meter == "gpu" {
			gpu += r.Requests
		}
		if !r.PeriodStart.Equal(jan) {
			t.Errorf("a rolled-up month's row at %s, want its first day", r.PeriodStart)
		}
	}
	if units != janUnits || gpu != janGPU || len(got) != 2 {
		t.Errorf("January by day after the drop: %d units, %d gpu requests in %d rows; want %d, %d in one row per meter",
			units, gpu, len(got), janUnits, janGPU)
	}
	if kept := days(feb, feb.AddDate(0, 1, 0)); len(kept) != 1 || kept[0].Units != 5 {
		t.Errorf("February by day: %+v, want one day of 5 units", kept)
	}
	again := invGenerate(t, inv, a, jan)
	if again.TotalCents != janInvoice.TotalCents || !slices.Equal(again.Lines, janInvoice.Lines) {
		t.Errorf("January's invoice after the drop: %d cents %+v, want %d cents %+v",
			again.TotalCents, again.Lines, janInvoice.TotalCents, janInvoice.Lines)
	}

	// Late usage of a dropped month lands in the default partition; the
	// next Run adds it to the month's totals.
	invUsage(t, db, a, jan.Add(7*time.Hour), 11, 0)
	clock.Set(clock.Now().Add(time.Hour))
	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, `SELECT units FROM usage_monthly WHERE tenant_id = $1 AND month = $2 AND meter = 'demo'`, a, jan); n != 1_200_011 {
		t.Errorf("January's demo units after late usage: %d, want 1200011", n)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage_default`); n != 0 {
		t.Errorf("usage_default holds %d rows after the Run, want 0", n)
	}
}

// TestPartitionsEnsureLosesNoRowWrittenMeanwhile: rows of a month without
// a partition keep arriving (in usage_default) while Ensure creates the
// month's partition and moves them; every row written ends up in the
// partition, none lost or doubled, none left in the default.
func TestPartitionsEnsureLosesNoRowWrittenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.Postgres(t)
	a := invTenant(t, db, "pro", time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC))
	month := time.Date(2033, 8, 1, 0, 0, 0, 0, time.UTC)
	p := NewPartitions(db, time.Now, 0)

	const writers, perWriter = 4, 60
	errs := make(chan error, writers)
	started := make(chan struct{}, writers)
	for w := range writers {
		go func() {
			for k := range perWriter {
				if k == 5 {
					started <- struct{}{}
				}
				// Each write adds 1 unit to one of 24 rows of the month.
				if _, err := db.Exec(ctx, `INSERT INTO usage AS u (tenant_id, hour, meter, units, requests) VALUES ($1, $2, $3, 1, 1)
					ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET units = u.units + 1`,
					a, month.Add(time.Duration(k%24)*time.Hour), fmt.Sprintf("m%d", w)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		<-started
	}
	if err := p.Ensure(ctx, month); err != nil {
		t.Fatal(err)
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatalf("a write while the partition was made: %v", err)
		}
	}
	if n := countRows(t, db, `SELECT coalesce(sum(units), 0) FROM usage_p203308`); n != writers*perWriter {
		t.Errorf("usage_p203308 holds %d units, want every one of the %d written", n, writers*perWriter)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage_p203308`); n != writers*24 {
		t.Errorf("usage_p203308 holds %d rows, want %d (24 hours × %d meters, each once)", n, writers*24, writers)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage_default`); n != 0 {
		t.Errorf("usage_default holds %d rows, want 0", n)
	}
}

// TestPartitionsDropLosesNoRowWrittenMeanwhile: late usage of a month
// past the retention keeps arriving while DropBefore rolls the month up
// and drops its partition; every unit written ends up counted once, in
// usage_monthly or (written after the drop) in usage_default, which the
// next DropBefore rolls up too.
func TestPartitionsDropLosesNoRowWrittenMeanwhile(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testenv.Postgres(t)
	a := invTenant(t, db, "pro", time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC))
	month := time.Date(2033, 2, 1, 0, 0, 0, 0, time.UTC)
	p := NewPartitions(db, time.Now, 0)
	if err := p.Ensure(ctx, month); err != nil {
		t.Fatal(err)
	}
	for h := range 24 {
		invExec(t, db, `INSERT INTO usage (tenant_id, hour, meter, units, requests) VALUES ($1, $2, 'm', 100, 1)`, a, month.Add(time.Duration(h)*time.Hour))
	}

	const writers, perWriter = 4, 60
	errs := make(chan error, writers)
	started := make(chan struct{}, writers)
	for range writers {
		go func() {
			for k := range perWriter {
				if k == 5 {
					started <- struct{}{}
				}
				if _, err := db.Exec(ctx, `INSERT INTO usage AS u (tenant_id, hour, meter, units, requests) VALUES ($1, $2, 'm', 1, 1)
					ON CONFLICT (tenant_id, hour, meter) DO UPDATE SET units = u.units + 1`,
					a, month.Add(time.Duration(k%24)*time.Hour)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		<-started
	}
	dropped, err := p.DropBefore(ctx, month.AddDate(0, 1, 0))
	if err != nil || !slices.Contains(dropped, "usage_p203302") || slices.Contains(dropped, "usage_p203303") {
		t.Fatalf("DropBefore: %v, %v; want usage_p203302 dropped (and the migration's months before it)", dropped, err)
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatalf("a write while the partition was dropped: %v", err)
		}
	}
	want := int64(24*100 + writers*perWriter)
	got := countRows(t, db, `SELECT coalesce(sum(units), 0) FROM usage_ledger WHERE tenant_id = $1`, a)
	if got != want {
		t.Errorf("the month's units in usage_ledger: %d, want %d", got, want)
	}
	if _, err := p.DropBefore(ctx, month.AddDate(0, 1, 0)); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, `SELECT units FROM usage_monthly WHERE tenant_id = $1 AND month = $2`, a, month); n != want {
		t.Errorf("usage_monthly: %d units, want %d", n, want)
	}
	if n := countRows(t, db, `SELECT count(*) FROM usage WHERE tenant_id = $1`, a); n != 0 {
		t.Errorf("%d hourly rows left, want 0", n)
	}
}
