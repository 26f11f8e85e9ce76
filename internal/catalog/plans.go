package catalog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// planStore is where tenants' tier changes are made (*catalogdb.Store).
type planStore interface {
	ChangeTenant(ctx context.Context, actor, id string, plan *quota.PlanRequest, now time.Time,
		change func(*quota.Tenant) error) (quota.Tenant, *quota.CounterReset, error)
	DuePlanChanges(ctx context.Context, now time.Time, limit int) ([]string, error)
	ApplyPlanChange(ctx context.Context, actor, id string, now time.Time) (quota.Tenant, *quota.CounterReset, bool, error)
	UnappliedResets(ctx context.Context, since time.Time, limit int) ([]quota.CounterReset, error)
	MarkResetApplied(ctx context.Context, id string) error
}

// resetter empties a tenant's live day and month counters (those of its
// calendar), once per reset (*ratelimit.Runner, in quotaredis.Store).
type resetter interface {
	ResetQuotasIn(ctx context.Context, tenantID string, cal quota.Calendar, at time.Time) (bool, error)
}

// WorkerActor is the actor the audit log records for changes the worker
// makes (pending plan changes applied).
const WorkerActor = "worker"

// planBatch bounds the pending changes, or resets, one run applies.
const planBatch = 500

// Plans changes tenants' tiers: at once or at the start of their next
// billing period (a pending change the worker applies), carrying or
// resetting the usage counted in the current day and month. Every tier
// change of the admin API, and the worker's, goes through it, on its one
// clock; each invalidates the tenant on every node.
//
// A quota reset is recorded in the change's transaction and applied to the
// live counters in Redis after the commit. When Redis fails then, the
// change stands (it is committed and answered as done) and the reset is
// applied by the worker's plans step within one reconcile interval:
// resets are applied once by their id, so the two never empty the counters
// twice, and the usage counted in between stays counted until then.
type Plans struct {
	store    planStore
	counters resetter
	cat      *Catalog
	now      func() time.Time
	log      *slog.Logger
}

// NewPlans returns the tier changes of store, resetting counters; cat
// publishes the changes.
func NewPlans(store planStore, counters resetter, cat *Catalog, now func() time.Time, log *slog.Logger) *Plans {
	return &Plans{store: store, counters: counters, cat: cat, now: now, log: log}
}

// Reset states of a Change: ResetNone when no reset was asked for (or the
// tier did not change now), ResetApplied when the counters were emptied,
// ResetPending when Redis did not answer and the worker will.
const (
	ResetNone    = ""
	ResetApplied = "applied"
	ResetPending = "pending"
)

// Change applies change to the tenant id, and the tier change plan (nil:
// none) as the store's ChangeTenant decides it at Plans' now. It returns
// the tenant and the state of the quota reset the change asked for.
func (p *Plans) Change(ctx context.Context, actor, id string, plan *quota.PlanRequest,
	change func(*quota.Tenant) error) (quota.Tenant, string, error) {
	t, reset, err := p.store.ChangeTenant(ctx, actor, id, plan, p.now(), change)
	if err != nil {
		return t, ResetNone, err
	}
	p.cat.invalidate(ctx, KindTenant, t.ID)
	if reset == nil {
		return t, ResetNone, nil
	}
	if err := p.applyReset(ctx, *reset); err != nil {
		p.log.Warn("quota reset recorded but not applied; the worker's plans step will apply it",
			"tenant_id", t.ID, "reset_id", reset.ID, "err", err)
		return t, ResetPending, nil
	}
	return t, ResetApplied, nil
}

// ApplyDue is the worker's plans step: it applies the pending changes due
// at now, each in its own transaction (effective at its effective_at,
// audited as the worker), then the quota resets not applied yet. It
// returns how many changes it applied. Idempotent and safe beside other
// workers: a change is applied once (the store re-reads it under the
// tenant's row lock), a reset once by its id.
func (p *Plans) ApplyDue(ctx context.Context) (int, error) {
	now := p.now()
	ids, err := p.store.DuePlanChanges(ctx, now, planBatch)
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, id := range ids {
		t, _, applied, err := p.store.ApplyPlanChange(ctx, WorkerActor, id, now)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if applied {
			n++
			p.cat.invalidate(ctx, KindTenant, t.ID)
		}
	}
	// The resets of the changes just applied are among the unapplied ones.
	if err := p.ApplyMissedResets(ctx); err != nil {
		errs = append(errs, err)
	}
	return n, errors.Join(errs...)
}

// ApplyMissedResets applies the recorded quota resets not applied yet, of
// the last 31 days at most (older ones empty periods long over).
func (p *Plans) ApplyMissedResets(ctx context.Context) error {
	missed, err := p.store.UnappliedResets(ctx, p.now().AddDate(0, 0, -31), planBatch)
	if err != nil {
		return err
	}
	for _, r := range missed {
		if err := p.applyReset(ctx, r); err != nil {
			return err
		}
	}
	return nil
}

// applyReset empties the live counters for r, marks it applied and lifts
// the tenant's cached refusals.
func (p *Plans) applyReset(ctx context.Context, r quota.CounterReset) error {
	if _, err := p.counters.ResetQuotasIn(ctx, r.TenantID, r.Calendar, r.At); err != nil {
		return fmt.Errorf("catalog: quota reset %s: %w", r.ID, err)
	}
	if err := p.store.MarkResetApplied(ctx, r.ID); err != nil {
		return err
	}
	p.cat.invalidate(ctx, KindRoom, r.TenantID)
	return nil
}
