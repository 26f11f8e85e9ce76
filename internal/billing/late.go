package billing

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// Late usage: a refund or settlement that reaches the ledger after its
// billing period's invoice is final.
//
// A final invoice never changes. Usage of its period can still arrive: a
// refund, a settlement at a lower cost or a proxy's refund of a 5xx gives
// units back within minutes of the admission, and with a short
// TOLLGATE_INVOICE_GRACE the invoice may be final by the time the flush
// records it. The flush that records such usage (Reconciler.record, which
// the usage API nodes record during a Redis outage goes through too)
// handles it in the same transaction, so that a batch recorded twice
// counts once:
//
//   - Before writing the batches' rows, it locks (FOR SHARE) the invoices
//     whose periods the rows fall in and have ended (lockLateInvoices).
//     The invoicer locks a draft FOR UPDATE before it rates and finalizes
//     it, so the two take turns: either the invoice becomes final with the
//     rows, or the flush sees it final and adjusts for them. (An invoice
//     the invoicer creates and finalizes in one transaction, that of a
//     tenant no refresh or sweep saw during its period, cannot be locked
//     before it commits: a refund recorded in that instant is missed.)
//   - For a final invoice late usage reaches for the first time, it rates
//     the period as it is before the rows (base_cents of
//     invoice_late_adjustments); then, after the rows are written, it
//     rates it again (rerated_cents). Both ratings are the invoice's own
//     (ratedTenant.rate over the stored period, with the prices in force
//     then), of its lines before credit draws. Taking the base from a
//     rating rather than from the stored lines keeps a setting that has no
//     history and changed since (a meter quota's price) from passing for
//     a give-back.
//   - The money given back is max(0, base - rerated); what it exceeds the
//     credits already given back for the invoice by becomes a credit
//     (credits, reason "Late refund of YYYY-MM", never expiring, created
//     now; audited as the worker's, naming the invoice), which the
//     tenant's next invoice draws as it draws any credit.
//     The difference is taken on the re-rated totals, never per give-back:
//     several give-backs credit exactly the total, and a rounding cent is
//     credited once.
//   - Late usage that raises a period (a settlement above the estimate) is
//     not billed: it stays in the ledger (usage, exports) and lowers what
//     later give-backs of the period credit, but no credit is ever taken
//     back and no charge is added. The worker counts such batches
//     (Reconciler.LateRaises) and logs them.
//
// Usage of a period whose invoice is still a draft needs none of this: the
// draft is rated again, with it, until it is final.

// lateLockMargin widens the periods lockLateInvoices locks to those ending
// up to this much after the flush's clock: a worker whose clock is ahead
// may finalize them first. In that last hour of a period, flushes and the
// refreshes of its drafts take turns on the drafts' rows.
const lateLockMargin = time.Hour

// lateInvoice is an invoice of a period that has ended, which the rows of
// a batch being recorded fall in.
type lateInvoice struct {
	id, tenant string
	label      time.Time // invoices.period
	start, end time.Time
	final      bool
	adjusted   bool // it has an invoice_late_adjustments row
}

// lateTally is what the late usage of one recording did, for the metrics.
type lateTally struct {
	credits, cents, raises int64
}

// lockLateInvoices locks FOR SHARE, in tenant and period order, the
// invoices of the periods ended by now (plus lateLockMargin) that the rows
// of batches fall in, and returns them. Most batches hold only the current
// hour's rows and find none.
func lockLateInvoices(ctx context.Context, tx pgx.Tx, batches []quota.Batch, now time.Time) ([]lateInvoice, error) {
	type span struct {
		tenant string
		lo, hi time.Time
	}
	var spans []span
	for _, b := range batches {
		if len(b.Rows) == 0 || !quota.ValidID(b.TenantID) {
			continue
		}
		sp := span{b.TenantID, b.Rows[0].Hour, b.Rows[0].Hour}
		for _, row := range b.Rows {
			sp.lo, sp.hi = minTime(sp.lo, row.Hour), maxTime(sp.hi, row.Hour)
		}
		spans = append(spans, sp)
	}
	if len(spans) == 0 {
		return nil, nil
	}
	// Tenant order, the invoicer's: the locks are taken in it.
	slices.SortFunc(spans, func(a, b span) int { return strings.Compare(a.tenant, b.tenant) })
	tenants := make([]string, len(spans))
	los := make([]time.Time, len(spans))
	his := make([]time.Time, len(spans))
	first := spans[0].lo
	for k, sp := range spans {
		tenants[k], los[k], his[k] = sp.tenant, sp.lo, sp.hi
		first = minTime(first, sp.lo)
	}
	// The rows of a flush are mostly of the last minutes: unless a period
	// of any tenant ended between the earliest row and now (an index probe,
	// invoices_period_end_idx), none of them falls in an ended period.
	var ended bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM invoices WHERE period_end > $1 AND period_end <= $2)`,
		first, now.Add(lateLockMargin)).Scan(&ended); err != nil {
		return nil, fmt.Errorf("billing: ended invoices: %w", err)
	}
	if !ended {
		return nil, nil
	}
	// One index range scan per tenant (invoices' (tenant_id, period)): a
	// label is the first of the month of its period's first local date, so
	// a period that ends after lo has a label after lo's less 33 days, and
	// one that starts by hi a label before hi's plus a day. Most find only
	// the current period's invoice, which has not ended.
	rows, err := tx.Query(ctx, `
		SELECT i.id::text, i.tenant_id::text, i.period, i.period_start, i.period_end, i.status = 'final',
		       EXISTS (SELECT 1 FROM invoice_late_adjustments a WHERE a.invoice_id = i.id)
		FROM unnest($1::uuid[], $2::timestamptz[], $3::timestamptz[]) WITH ORDINALITY AS b(tenant_id, lo, hi, n)
		CROSS JOIN LATERAL (
			SELECT * FROM invoices i
			WHERE i.tenant_id = b.tenant_id
			  AND i.period > (b.lo - interval '33 days')::date AND i.period <= (b.hi + interval '1 day')::date
			  AND i.period_end > b.lo AND i.period_start <= b.hi AND i.period_end <= $4
			ORDER BY i.period
			FOR SHARE
		) i
		ORDER BY b.n, i.period`, tenants, los, his, now.Add(lateLockMargin))
	if err != nil {
		return nil, fmt.Errorf("billing: lock ended invoices: %w", err)
	}
	var out []lateInvoice
	var li lateInvoice
	_, err = pgx.ForEachRow(rows, []any{&li.id, &li.tenant, &li.label, &li.start, &li.end, &li.final, &li.adjusted}, func() error {
		li.label, li.start, li.end = li.label.UTC(), li.start.UTC(), li.end.UTC()
		out = append(out, li)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: lock ended invoices: %w", err)
	}
	return out, nil
}

// touches reports whether a row of b falls in li's period.
func (li lateInvoice) touches(b quota.Batch) bool {
	if b.TenantID != li.tenant {
		return false
	}
	for _, row := range b.Rows {
		if !row.Hour.Before(li.start) && row.Hour.Before(li.end) {
			return true
		}
	}
	return false
}

// rateCharges rates the periods of the invoices invs as the invoicer rates
// them (ratedTenant.rate: the stored period, the tenant's tier and price
// history, its overrides, the ledger as this transaction sees it) and
// returns each one's charge before credit draws, by invoice id. Invoices
// of tenants that no longer exist are left out.
func rateCharges(ctx context.Context, tx pgx.Tx, invs []lateInvoice) (map[string]int64, error) {
	out := make(map[string]int64, len(invs))
	if len(invs) == 0 {
		return out, nil
	}
	var ids []string
	seen := map[string]bool{}
	for _, li := range invs {
		if !seen[li.tenant] {
			seen[li.tenant] = true
			ids = append(ids, li.tenant)
		}
	}
	bases, err := loadTenantBases(ctx, tx, ids)
	if err != nil {
		return nil, err
	}
	// Each round rates at most one invoice per tenant: the rating inputs
	// are gathered by tenant.
	left := invs
	for len(left) > 0 {
		var ts []*ratedTenant
		var of []string // invoice ids of ts
		byID := map[string]*ratedTenant{}
		var next []lateInvoice
		for _, li := range left {
			base, ok := bases[li.tenant]
			switch {
			case !ok:
				continue
			case byID[li.tenant] != nil:
				next = append(next, li)
				continue
			}
			t := base
			// (Zone only dates the lines' descriptions: the amounts do
			// not depend on it.)
			t.in = RatingInput{Start: li.start, End: li.end}
			ts, of, byID[li.tenant] = append(ts, &t), append(of, li.id), &t
		}
		if len(ts) > 0 {
			if err := loadRatingInputs(ctx, tx, ts, byID); err != nil {
				return nil, err
			}
			for k, t := range ts {
				out[of[k]] = TotalCents(t.rate())
			}
		}
		left = next
	}
	return out, nil
}

// loadTenantBases reads what rating needs of the tenants ids besides their
// periods' data: their creation, overrides and current tier (which rates
// a period their tier history does not cover). Tenants that do not exist
// are absent.
func loadTenantBases(ctx context.Context, tx pgx.Tx, ids []string) (map[string]ratedTenant, error) {
	out := make(map[string]ratedTenant, len(ids))
	var t ratedTenant
	c := &t.current
	rows, err := tx.Query(ctx, `
		SELECT t.id::text, t.created_at, t.overrides,
		       tr.slug, tr.name, tr.price_cents, tr.monthly_quota, tr.overage, tr.overage_price_cents_per_1k, tr.billing
		FROM tenants t JOIN tiers tr ON tr.slug = t.tier WHERE t.id = ANY($1::uuid[])`, ids)
	if err != nil {
		return nil, fmt.Errorf("billing: tenants: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&t.id, &t.created, &t.overrides,
		&c.Tier, &c.Name, &c.PriceCents, &c.MonthlyQuota, &c.Overage, &c.OveragePriceCentsPer1K, &c.Billing}, func() error {
		out[t.id] = t
		t = ratedTenant{} // (a scan into the same overrides would keep fields the next row lacks)
		c = &t.current
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: tenants: %w", err)
	}
	return out, nil
}

// lateAdjust credits what the newly recorded batches (isNew) give back of
// the final invoices late (locked by lockLateInvoices before the rows were
// written; before holds the charges of those without an adjustment yet,
// rated then). See "Late usage" above. In the caller's transaction.
func (r *Reconciler) lateAdjust(ctx context.Context, tx pgx.Tx, late []lateInvoice, before map[string]int64,
	batches []quota.Batch, isNew map[string]bool) (lateTally, error) {
	var tally lateTally
	var hit []lateInvoice
	for _, li := range late {
		if !li.final {
			continue
		}
		for _, b := range batches {
			if isNew[b.ID] && li.touches(b) {
				hit = append(hit, li)
				break
			}
		}
	}
	if len(hit) == 0 {
		return tally, nil
	}
	now := r.now()
	var newIDs []string
	var newBase []int64
	invIDs := make([]string, len(hit))
	for k, li := range hit {
		invIDs[k] = li.id
		if base, ok := before[li.id]; ok && !li.adjusted {
			newIDs, newBase = append(newIDs, li.id), append(newBase, base)
		}
	}
	if len(newIDs) > 0 {
		if _, err := tx.Exec(ctx, `
			INSERT INTO invoice_late_adjustments (invoice_id, base_cents, rerated_cents, created_at, updated_at)
			SELECT v.id, v.base, v.base, $3, $3 FROM unnest($1::uuid[], $2::bigint[]) AS v(id, base)
			ORDER BY v.id
			ON CONFLICT (invoice_id) DO NOTHING`, newIDs, newBase, now); err != nil {
			return tally, fmt.Errorf("billing: late adjustments: %w", err)
		}
	}
	type adjustment struct{ base, rerated, credited int64 }
	adj := make(map[string]adjustment, len(hit))
	var id string
	var a adjustment
	rows, err := tx.Query(ctx, `
		SELECT invoice_id::text, base_cents, rerated_cents, credited_cents FROM invoice_late_adjustments
		WHERE invoice_id = ANY($1::uuid[]) ORDER BY invoice_id FOR UPDATE`, invIDs)
	if err != nil {
		return tally, fmt.Errorf("billing: late adjustments: %w", err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&id, &a.base, &a.rerated, &a.credited}, func() error {
		adj[id] = a
		return nil
	}); err != nil {
		return tally, fmt.Errorf("billing: late adjustments: %w", err)
	}
	after, err := rateCharges(ctx, tx, hit)
	if err != nil {
		return tally, err
	}

	var (
		updIDs                  []string
		updRerated, updCredited []int64
		crTenants, crReasons    []string
		crInvoices              []string
		crCents                 []int64
	)
	for _, li := range hit {
		a, ok := adj[li.id]
		charge, rated := after[li.id]
		if !ok || !rated {
			continue // (a tenant deleted meanwhile)
		}
		if charge > a.rerated {
			tally.raises++
			r.log.Warn("late usage raised a final invoice's period: not billed",
				"tenant_id", li.tenant, "invoice_id", li.id, "period", li.label.Format("2006-01"),
				"rated_cents", a.rerated, "rerated_cents", charge)
		}
		credit := min(max(a.base-charge, 0)-a.credited, quota.MaxPrice)
		if credit > 0 {
			a.credited += credit
			crTenants, crReasons, crCents = append(crTenants, li.tenant), append(crReasons, lateReason(li.label)), append(crCents, credit)
			crInvoices = append(crInvoices, li.id)
			tally.credits++
			tally.cents += credit
			r.log.Info("late refund of a final invoice's period: credited on the next invoice",
				"tenant_id", li.tenant, "invoice_id", li.id, "period", li.label.Format("2006-01"), "credit_cents", credit)
		}
		updIDs, updRerated, updCredited = append(updIDs, li.id), append(updRerated, charge), append(updCredited, a.credited)
	}
	if len(crTenants) > 0 {
		// Each credit is audited as the worker's, naming the final invoice
		// it gives back for (v, referenced twice, is computed once).
		if _, err := tx.Exec(ctx, `
			WITH v AS (
				SELECT gen_random_uuid() AS id, u.* FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::uuid[]) AS u(tenant_id, cents, reason, invoice_id)
			), c AS (
				INSERT INTO credits (id, tenant_id, amount_cents, reason, created_at)
				SELECT id, tenant_id, cents, reason, $5 FROM v
			)
			INSERT INTO audit_log (actor, action, entity, entity_id, after)
			SELECT 'worker', 'create', 'credit', v.id::text,
			       jsonb_build_object('id', v.id, 'tenant_id', v.tenant_id, 'kind', 'grant', 'amount_cents', v.cents,
			                          'reason', v.reason, 'expires_at', NULL, 'created_at', $5::timestamptz,
			                          'remaining_cents', v.cents, 'late_refund_of_invoice_id', v.invoice_id)
			FROM v`,
			crTenants, crCents, crReasons, crInvoices, now); err != nil {
			return tally, fmt.Errorf("billing: late refund credits: %w", err)
		}
	}
	if len(updIDs) > 0 {
		if _, err := tx.Exec(ctx, `
			UPDATE invoice_late_adjustments a SET rerated_cents = v.rerated, credited_cents = v.credited, updated_at = $4
			FROM unnest($1::uuid[], $2::bigint[], $3::bigint[]) AS v(id, rerated, credited)
			WHERE a.invoice_id = v.id`, updIDs, updRerated, updCredited, now); err != nil {
			return tally, fmt.Errorf("billing: late adjustments: %w", err)
		}
	}
	return tally, nil
}

// lateReason is the reason of the credit that gives back late usage of the
// period labelled label: its invoice line reads "Credit: Late refund of
// 2026-11".
func lateReason(label time.Time) string {
	return "Late refund of " + label.Format("2006-01")
}
