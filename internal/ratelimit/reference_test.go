package ratelimit

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/limits"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// ref is the tests' reference of the scripts for one tenant:
// internal/limits, the limit algebra in Go, on a State that mirrors what
// Redis holds. The zero ref is a tenant with no state. It panics on input
// the Runner would reject: it is an oracle for valid requests.
type ref struct {
	limits.State
	// record, when set, gets each operation in internal/limits' terms:
	// its inputs and its answer (traces of internal/limits' own tests).
	record func(step map[string]any)
}

// note records an operation on list l, with answer, when recording.
func (m *ref) note(l *limits.List, step map[string]any, answer any) {
	if m.record == nil {
		return
	}
	if l != nil {
		step["list"] = l.Wire()
		if cal := l.Calendar; !cal.IsDefault() {
			step["zone"], step["anchor"] = cal.Zone.String(), cal.AnchorDay
		}
	}
	step["want"] = fmt.Sprint(answer)
	m.record(step)
}

// answerOf is a decision as a trace holds it: its flat answer, or its
// error.
func answerOf(d limits.Decision, err error) string {
	if err != nil {
		return "error " + err.Error()
	}
	return fmt.Sprint(d.Flat(true))
}

// list compiles req's list.
func list(req quota.Request) *limits.List {
	l, err := limits.Compile(limits.PlanOf(req), req.Meter)
	if err != nil {
		panic("ratelimit: reference: " + err.Error())
	}
	return l
}

// Admit decides req at now (req.Now is ignored) as Runner.Admit does. A
// prepaid request whose balance is of another period answers the error
// Runner.Admit answers.
func (m *ref) Admit(req quota.Request, now time.Time) quota.Decision {
	d, err := m.admit(req, now)
	if err != nil {
		panic(err)
	}
	return d
}

func (m *ref) admit(req quota.Request, now time.Time) (quota.Decision, error) {
	l := list(req)
	r := limits.Request{Now: now.UnixMicro(), Cost: req.Cost, Meter: req.Meter, Prepaid: req.Prepaid}
	switch {
	case req.DryRun:
		r.Mode = limits.Dry
	case req.IdempotencyKey != "":
		r.IdemKey, r.Fingerprint, r.Lease = redisfn.IdemHash(req.IdempotencyKey), req.IdempotencyFingerprint, req.IdempotencyLease.Microseconds()
	}
	d, err := l.Decide(&m.State, r)
	m.note(l, map[string]any{"op": "decide", "req": r}, answerOf(d, err))
	if err != nil {
		return quota.Decision{}, err
	}
	return d.Quota(l), nil
}

// Peek reports the limits as they stand, as Runner.PeekIn does (the
// monthly quota as a hard cap).
func (m *ref) Peek(lim quota.Limits, cal quota.Calendar, now time.Time) quota.Decision {
	l, err := limits.Compile(limits.Plan{Limits: lim, Calendar: cal}, "-")
	if err != nil {
		panic("ratelimit: reference: " + err.Error())
	}
	d := l.Report(&m.State, now.UnixMicro())
	m.note(l, map[string]any{"op": "report", "now": now.UnixMicro()}, answerOf(d, nil))
	return d.Quota(l)
}

// Grant adds units to the "day" or "month" of now, as Runner.Grant does.
func (m *ref) Grant(period string, units int64, now time.Time) {
	n := limits.Grant(&m.State, quota.Calendar{}, now.UnixMicro(), period == "month", units, "", 0)
	m.note(nil, map[string]any{"op": "grant", "now": now.UnixMicro(), "monthly": period == "month", "units": units}, n)
}

// Reset applies a quota reset, as Runner.ResetQuotasIn does; now is the
// script's clock (Redis TIME).
func (m *ref) Reset(stamp, day, month, now int64) int {
	n := limits.Reset(&m.State, stamp, day, month, now)
	m.note(nil, map[string]any{"op": "reset", "stamp": stamp, "day": day, "month": month, "now": now}, n)
	return n
}

// StoreAnswer marks the record of key answered, as lua/idem.lua 'store'
// does.
func (m *ref) StoreAnswer(key, fp string) bool {
	ok := m.State.StoreAnswer(redisfn.IdemHash(key), fp)
	m.note(nil, map[string]any{"op": "store", "key": redisfn.IdemHash(key), "fp": fp}, ok)
	return ok
}

// Refund gives back what d admitted of req, as Runner.RefundRequest does.
func (m *ref) Refund(req quota.Request, d quota.Decision) {
	l, a := list(req), limits.AdmissionOf(req, d)
	over := l.GiveBack(&m.State, a, req.Cost)
	m.note(l, map[string]any{"op": "giveback", "adm": a, "units": req.Cost}, over)
}

// Settle settles req, admitted by d, to actual, as Runner.Settle does
// after Runner.Reserve; it returns the settlement.
func (m *ref) Settle(req quota.Request, d quota.Decision, actual int64) quota.Settlement {
	l, a := list(req), limits.AdmissionOf(req, d)
	delta, over := l.Settle(&m.State, a, actual)
	m.note(l, map[string]any{"op": "settle", "adm": a, "units": actual}, []int64{delta, over})
	return quota.Settlement{Status: quota.SettleApplied, Delta: delta, OverageDelta: over}
}

// diffStates lists the fields in which two states differ, "" when none.
func diffStates(got, want *limits.State) string {
	gt, gm, gi := got.Format()
	wt, wm, wi := want.Format()
	var diffs []string
	for _, h := range []struct {
		name      string
		got, want map[string]string
	}{{"tenant", gt, wt}, {"meters", gm, wm}} {
		for _, f := range union(h.got, h.want) {
			if g, w := h.got[f], h.want[f]; g != w {
				diffs = append(diffs, fmt.Sprintf("%s %s: got %q, want %q", h.name, f, g, w))
			}
		}
	}
	for _, k := range union(gi, wi) {
		for _, f := range []string{"fp", "st", "dec", "lease", "at"} {
			if g, w := gi[k][f], wi[k][f]; g != w {
				diffs = append(diffs, fmt.Sprintf("idem %.8s %s: got %q, want %q", k, f, g, w))
			}
		}
	}
	return strings.Join(diffs, "; ")
}

func union[V any](a, b map[string]V) []string {
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
