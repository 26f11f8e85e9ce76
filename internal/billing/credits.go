package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
)

// CreditEntry is one entry of a tenant's credit ledger: a grant of credit by
// an admin, or a draw of a credit onto a final invoice.
//
// Prepaid credits (API.md "Plans (v2)", Credits) are money an admin puts on
// a tenant's account, which its invoices draw before anything is owed.
//
// How invoices draw them, and why it is exactly once:
//
//   - A credit pays the invoice of a billing period (the tenant's own:
//     see Invoicer) it was valid at the end of: created before the
//     period's end and not expired before it (expires_at >= end). Credit
//     that expired earlier is never drawn; credit granted after the end
//     (in the invoice's grace) pays later periods only. One Go function
//     says so (availableCredit.pays), for the invoices and for the
//     prepaid balance (Ledger.Prepaid), which must agree on it.
//   - The credits a month may draw are taken oldest-expiring first (those
//     that never expire last; then oldest first: drawOrder), each for as
//     much as is left of it, until the invoice's total is paid: an invoice
//     never goes below zero. Each draw is a negative line "Credit:
//     <reason>". Invoices become final oldest period first, each drawing
//     what the ones before it left (creditPool).
//   - A draft shows the draws it would make from what is left of each
//     credit now, recomputed on every refresh and recorded nowhere: while
//     last month waits for its grace, its draft and this month's may both
//     show the same credit.
//   - Draws are recorded only when the invoice becomes final, in the very
//     transaction that makes it final: generateTx holds the draft invoice's
//     row lock (so a second finalizer waits, then finds it final and skips
//     it: a rerun draws nothing more), locks the tenants' credit rows FOR
//     UPDATE in one order (so finalizers of two months of one tenant take
//     turns, and the second reads what the first drew), inserts the draws
//     into credit_draws and raises credits.drawn_cents. Each finalizer
//     takes all its invoice locks before any credit lock, both in one
//     order, so no two wait on each other. A final invoice is never
//     regenerated, so its credit lines never change. The schema backs this
//     up: drawn_cents never exceeds the amount, and a credit is drawn at
//     most once per invoice.
type CreditEntry struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
	Kind     string `json:"kind"` // CreditGrant or CreditDraw
	// AmountCents is positive for a grant, negative for a draw.
	AmountCents int64 `json:"amount_cents"`
	// Reason and ExpiresAt are the grant's (for a draw, its credit's).
	Reason    string     `json:"reason"`
	ExpiresAt *time.Time `json:"expires_at"`
	CreatedAt time.Time  `json:"created_at"`
	// CreditID is the grant a draw drew on; nil for a grant.
	CreditID *string `json:"credit_id"`
	// InvoiceID is the invoice a draw paid; nil for a grant.
	InvoiceID *string `json:"invoice_id"`
	// RemainingCents is what invoices have not drawn of a grant yet
	// (expired or not); nil for a draw.
	RemainingCents *int64 `json:"remaining_cents"`
}

// The kinds of CreditEntry.
const (
	CreditGrant = "grant"
	CreditDraw  = "draw"
)

// CreditPage is one page of a tenant's credit ledger, newest first, with the
// tenant's balance: the credit neither expired nor drawn at the time asked.
type CreditPage struct {
	Items        []CreditEntry `json:"items"`
	NextCursor   *string       `json:"next_cursor"`
	BalanceCents int64         `json:"balance_cents"`
}

// NewCredit is a credit to grant: AmountCents between 1 and quota.MaxPrice,
// a Reason of 1 to MaxCreditReason characters (it becomes the invoice line
// "Credit: <reason>"), and an optional ExpiresAt in the future.
type NewCredit struct {
	AmountCents int64
	Reason      string
	ExpiresAt   *time.Time
}

// MaxCreditReason bounds a credit's reason, in characters.
const MaxCreditReason = 200

// Check returns a field error naming what is wrong with c, save its expiry,
// or nil.
func (c NewCredit) Check() error {
	if c.AmountCents < 1 || c.AmountCents > quota.MaxPrice {
		return quota.FieldError("amount_cents", "must be an integer between 1 and %d", quota.MaxPrice)
	}
	if n := utf8.RuneCountInString(c.Reason); n < 1 || n > MaxCreditReason {
		return quota.FieldError("reason", "must be 1 to %d characters", MaxCreditReason)
	}
	return quota.CheckText("reason", c.Reason)
}

// checkExpiry returns a field error unless c expires after now (both to
// Postgres' microsecond), or never.
func (c NewCredit) checkExpiry(now time.Time) error {
	if c.ExpiresAt != nil && !c.ExpiresAt.Truncate(time.Microsecond).After(now.Truncate(time.Microsecond)) {
		return quota.FieldError("expires_at", "must be in the future")
	}
	return nil
}

const grantRowColumns = `id::text, tenant_id::text, 'grant', amount_cents, reason, expires_at, created_at,
	NULL::text, NULL::text, amount_cents - drawn_cents`

func creditDest(e *CreditEntry) []any {
	return []any{&e.ID, &e.TenantID, &e.Kind, &e.AmountCents, &e.Reason, &e.ExpiresAt, &e.CreatedAt,
		&e.CreditID, &e.InvoiceID, &e.RemainingCents}
}

// CreateCredit grants the credit c to the tenant at now, as actor, with an
// audit entry in the same transaction. Under an idempotency key (the admin's
// Idempotency-Key; "" for none) it records at most one credit per tenant and
// key: a repeat with the same amount, reason and expiry returns the credit
// first recorded, with created false, and records nothing; with another one
// it is a CodeMismatch error (a repeat is answered even once the credit's
// expiry has passed). An unknown tenant is CodeNotFound; invalid input a
// CodeInvalid error naming the field.
func (l *Ledger) CreateCredit(ctx context.Context, actor, tenantID, key string, c NewCredit, now time.Time) (e CreditEntry, created bool, err error) {
	if err := c.Check(); err != nil {
		return e, false, err
	}
	now = now.UTC().Truncate(time.Microsecond) // Postgres' precision: stored as given
	if c.ExpiresAt != nil {
		exp := c.ExpiresAt.UTC().Truncate(time.Microsecond)
		c.ExpiresAt = &exp
	}
	var idem *string
	if key != "" {
		idem = &key
	}
	err = pgx.BeginFunc(ctx, l.db, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `SELECT id::text FROM tenants WHERE id::text = $1 FOR SHARE`, tenantID).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
		}
		if err != nil {
			return fmt.Errorf("billing: tenant: %w", err)
		}
		// replay answers the credit recorded under key, if there is one.
		replay := func() (bool, error) {
			err := tx.QueryRow(ctx, `SELECT `+grantRowColumns+` FROM credits WHERE tenant_id = $1 AND idempotency_key = $2`,
				id, key).Scan(creditDest(&e)...)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			if err != nil {
				return false, fmt.Errorf("billing: credit by idempotency key: %w", err)
			}
			if e.AmountCents != c.AmountCents || e.Reason != c.Reason || !sameTime(e.ExpiresAt, c.ExpiresAt) {
				return true, &quota.Error{Code: quota.CodeMismatch, Field: "Idempotency-Key", Message: fmt.Sprintf(
					"the key was used for another credit (%s, %d cents); use a new key for another credit", e.ID, e.AmountCents)}
			}
			return true, nil
		}
		if key != "" {
			if found, err := replay(); found || err != nil {
				return err
			}
		}
		if err := c.checkExpiry(now); err != nil {
			return err
		}
		// A concurrent insert with the same key makes this one wait for its
		// commit, then do nothing: replay finds its credit.
		err = tx.QueryRow(ctx, `INSERT INTO credits (tenant_id, amount_cents, reason, expires_at, created_at, idempotency_key)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
			RETURNING `+grantRowColumns, id, c.AmountCents, c.Reason, c.ExpiresAt, now, idem).Scan(creditDest(&e)...)
		if errors.Is(err, pgx.ErrNoRows) {
			if found, err := replay(); found || err != nil {
				return err
			}
			return fmt.Errorf("billing: insert credit: key %q conflicted, but holds no credit", key)
		}
		if err != nil {
			return fmt.Errorf("billing: insert credit: %w", err)
		}
		created = true
		after, err := json.Marshal(e)
		if err != nil {
			return fmt.Errorf("billing: audit credit: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO audit_log (actor, action, entity, entity_id, after) VALUES ($1, 'create', 'credit', $2, $3)`,
			actor, e.ID, after); err != nil {
			return fmt.Errorf("billing: audit credit: %w", err)
		}
		return nil
	})
	return e, created, err
}

// Credit returns the credit id granted to the tenant, as its ledger lists
// it; CodeNotFound when the tenant has no such credit.
func (l *Ledger) Credit(ctx context.Context, tenantID, id string) (CreditEntry, error) {
	var e CreditEntry
	err := l.db.QueryRow(ctx, `SELECT `+grantRowColumns+` FROM credits WHERE tenant_id::text = $1 AND id::text = $2`,
		tenantID, id).Scan(creditDest(&e)...)
	if errors.Is(err, pgx.ErrNoRows) {
		return e, quota.Errorf(quota.CodeNotFound, "no credit %q of tenant %q", id, tenantID)
	}
	if err != nil {
		return e, fmt.Errorf("billing: credit: %w", err)
	}
	return e, nil
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// Credits returns a page of the tenant's credit ledger (grants and draws),
// newest first, and its balance at now: what is left of the credits not
// expired at now. An unknown tenant is CodeNotFound; a cursor this listing
// did not return is CodeInvalid.
func (l *Ledger) Credits(ctx context.Context, tenantID string, now time.Time, p quota.Page) (CreditPage, error) {
	var afterAt *time.Time
	var afterID *string
	if p.Cursor != "" {
		at, id, err := decodeAlertCursor(p.Cursor) // created_at and id, as alerts page
		if err != nil {
			return CreditPage{}, quota.FieldError("cursor", "is not a cursor this listing returned")
		}
		afterAt, afterID = &at, &id
	}
	out := CreditPage{Items: []CreditEntry{}}
	// One snapshot: the balance agrees with the entries listed.
	err := pgx.BeginTxFunc(ctx, l.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `SELECT id::text FROM tenants WHERE id::text = $1`, tenantID).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return quota.Errorf(quota.CodeNotFound, "no tenant %q", tenantID)
		}
		if err != nil {
			return fmt.Errorf("billing: tenant: %w", err)
		}
		rows, err := tx.Query(ctx, `
			SELECT e.id::text, $1::text, e.kind, e.amount_cents, e.reason, e.expires_at, e.created_at,
			       e.credit_id::text, e.invoice_id::text, e.remaining_cents
			FROM (
				SELECT id, 'grant' AS kind, amount_cents, reason, expires_at, created_at,
				       NULL::uuid AS credit_id, NULL::uuid AS invoice_id, amount_cents - drawn_cents AS remaining_cents
				FROM credits WHERE tenant_id = $1
				UNION ALL
				SELECT d.id, 'draw', -d.amount_cents, c.reason, c.expires_at, d.created_at, c.id, d.invoice_id, NULL
				FROM credit_draws d JOIN credits c ON c.id = d.credit_id WHERE c.tenant_id = $1
			) e
			WHERE $2::timestamptz IS NULL OR (e.created_at, e.id) < ($2::timestamptz, $3::uuid)
			ORDER BY e.created_at DESC, e.id DESC LIMIT $4`, id, afterAt, afterID, p.Limit+1)
		if err != nil {
			return fmt.Errorf("billing: credit ledger: %w", err)
		}
		items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (CreditEntry, error) {
			var e CreditEntry
			return e, row.Scan(creditDest(&e)...)
		})
		if err != nil {
			return fmt.Errorf("billing: credit ledger: %w", err)
		}
		if len(items) > p.Limit {
			items = items[:p.Limit]
			last := items[len(items)-1]
			next := encodeAlertCursor(last.CreatedAt, last.ID)
			out.NextCursor = &next
		}
		out.Items = append(out.Items, items...)
		err = tx.QueryRow(ctx, `
			SELECT least(coalesce(sum(amount_cents - drawn_cents), 0), 9223372036854775807)::bigint
			FROM credits WHERE tenant_id = $1 AND (expires_at IS NULL OR expires_at > $2)`, id, now).Scan(&out.BalanceCents)
		if err != nil {
			return fmt.Errorf("billing: credit balance: %w", err)
		}
		return nil
	})
	return out, err
}

// availableCredit is a tenant's credit that is not drawn in full, with
// what is left of it.
type availableCredit struct {
	id, reason string
	leftCents  int64
	createdAt  time.Time
	expiresAt  *time.Time // nil: never
}

// pays reports whether c may pay the invoice of the billing period ending
// at end: it was granted before the period ended and had not expired
// before it did (valid at the period's end). This is the one rule of which
// credit pays which invoice: the invoices draw by it, and the prepaid
// balance (Ledger.Prepaid) counts by it what each invoice not final yet
// will draw. A credit granted after a period ended (in its invoice's
// grace) pays later periods only; one that expires before the period it
// was granted in ends pays none.
func (c availableCredit) pays(end time.Time) bool {
	return c.createdAt.Before(end) && (c.expiresAt == nil || !c.expiresAt.Before(end))
}

// drawOrder is the order in which an invoice draws the credits that pay
// it: soonest expiring first, those that never expire last, then the
// oldest granted first (then by id, for a total order).
func drawOrder(a, b availableCredit) int {
	switch {
	case a.expiresAt == nil && b.expiresAt != nil:
		return 1
	case a.expiresAt != nil && b.expiresAt == nil:
		return -1
	case a.expiresAt != nil:
		if c := a.expiresAt.Compare(*b.expiresAt); c != 0 {
			return c
		}
	}
	if c := a.createdAt.Compare(b.createdAt); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

// creditPool is what is left of one tenant's credits, in drawOrder, as
// its invoices draw on them one after another, oldest period first (the
// order they become final in).
type creditPool []availableCredit

// newCreditPool returns the pool of cs (which it sorts).
func newCreditPool(cs []availableCredit) creditPool {
	slices.SortFunc(cs, drawOrder)
	return cs
}

// creditDraw is the part of one credit an invoice draws.
type creditDraw struct {
	creditID, reason string
	cents            int64
}

// draw takes from the pool the draws that pay total on the invoice of the
// period ending at end: the credits that pay it (availableCredit.pays), in
// drawOrder, each for at most what is left of it, together at most total
// (nothing when total is not positive).
func (p creditPool) draw(total int64, end time.Time) []creditDraw {
	var draws []creditDraw
	for k := range p {
		c := &p[k]
		if total <= 0 {
			break
		}
		n := min(c.leftCents, total)
		if n <= 0 || !c.pays(end) {
			continue
		}
		draws = append(draws, creditDraw{creditID: c.id, reason: c.reason, cents: n})
		c.leftCents -= n
		total -= n
	}
	return draws
}

// left returns what is left of the credits that pay the invoice of the
// period ending at end, and not that of the period ending at not (zero
// Time: no such condition), in cents.
func (p creditPool) left(end, not time.Time) int64 {
	var n int64
	for _, c := range p {
		if c.pays(end) && (not.IsZero() || !c.pays(not)) {
			n += c.leftCents
		}
	}
	return n
}

// creditLine is the invoice line of a draw.
func creditLine(d creditDraw) InvoiceLine {
	return InvoiceLine{Kind: "credit", Description: "Credit: " + d.reason, Quantity: 1, AmountCents: -d.cents}
}

// loadCredits fills the pool of credits of each tenant of ts (also
// indexed by id): every credit of the tenant not drawn in full, whichever
// period it pays (availableCredit.pays decides, as the pool draws). With
// lock, the credit rows are locked FOR UPDATE, in one order for every
// caller, so that finalizers take turns on a tenant's credits; a row
// another finalizer changed meanwhile is read as it committed it.
func loadCredits(ctx context.Context, tx pgx.Tx, ts []*ratedTenant, byID map[string]*ratedTenant, lock bool) error {
	if len(ts) == 0 {
		return nil
	}
	ids := make([]string, len(ts))
	for k, t := range ts {
		ids[k] = t.id
	}
	pools, err := creditPools(ctx, tx, ids, lock)
	if err != nil {
		return err
	}
	for id, p := range pools {
		byID[id].credits = p
	}
	return nil
}

// creditPools returns the pools of credits of the tenants ids, locked FOR
// UPDATE with lock (see loadCredits). Tenants without credit have none.
func creditPools(ctx context.Context, tx pgx.Tx, ids []string, lock bool) (map[string]creditPool, error) {
	sql := `
		SELECT tenant_id::text, id::text, reason, amount_cents - drawn_cents, created_at, expires_at
		FROM credits WHERE tenant_id = ANY($1::uuid[]) AND drawn_cents < amount_cents
		ORDER BY tenant_id, id`
	if lock {
		sql += ` FOR UPDATE`
	}
	rows, err := tx.Query(ctx, sql, ids)
	if err != nil {
		return nil, fmt.Errorf("billing: credits: %w", err)
	}
	out := map[string]creditPool{}
	var tenantID string
	var c availableCredit
	_, err = pgx.ForEachRow(rows, []any{&tenantID, &c.id, &c.reason, &c.leftCents, &c.createdAt, &c.expiresAt}, func() error {
		out[tenantID] = append(out[tenantID], c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("billing: credits: %w", err)
	}
	for id, p := range out {
		out[id] = newCreditPool(p)
	}
	return out, nil
}

// recordDraws records the draws of final invoices (invoiceIDs[k] draws
// draws[k]) at now: the ledger's draws, and what each credit has drawn.
func recordDraws(ctx context.Context, tx pgx.Tx, now time.Time, invoiceIDs []string, draws []creditDraw) error {
	if len(draws) == 0 {
		return nil
	}
	credits := make([]string, len(draws))
	cents := make([]int64, len(draws))
	for k, d := range draws {
		credits[k], cents[k] = d.creditID, d.cents
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO credit_draws (credit_id, invoice_id, amount_cents, created_at)
		SELECT v.credit_id, v.invoice_id, v.cents, $4 FROM unnest($1::uuid[], $2::uuid[], $3::bigint[]) AS v(credit_id, invoice_id, cents)`,
		credits, invoiceIDs, cents, now); err != nil {
		return fmt.Errorf("billing: insert credit draws: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		UPDATE credits c SET drawn_cents = c.drawn_cents + v.cents
		FROM (SELECT credit_id, sum(cents)::bigint AS cents FROM unnest($1::uuid[], $2::bigint[]) AS u(credit_id, cents) GROUP BY credit_id) v
		WHERE c.id = v.credit_id`, credits, cents); err != nil {
		return fmt.Errorf("billing: draw credits: %w", err)
	}
	return nil
}
