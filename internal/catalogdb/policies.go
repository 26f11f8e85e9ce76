package catalogdb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
)

// Policies are stored whole, each the JSON of its quota.Policy (spec)
// under its name (migrations/000005_policies.up.sql). Names sort bytewise
// (COLLATE "C"), whatever the database's collation.

func collectPolicies(rows pgx.Rows) ([]quota.Policy, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (quota.Policy, error) {
		var p quota.Policy
		return p, row.Scan(&p)
	})
}

// Policies returns every policy, by name: what the catalog caches.
func (s *Store) Policies(ctx context.Context) ([]quota.Policy, error) {
	return policiesTx(ctx, s.db)
}

type rowsQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func policiesTx(ctx context.Context, q rowsQuerier) ([]quota.Policy, error) {
	rows, err := q.Query(ctx, `SELECT spec FROM policies ORDER BY name COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("postgres: policies: %w", err)
	}
	ps, err := collectPolicies(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: policies: %w", err)
	}
	return ps, nil
}

// ListPolicies returns a page of policies, by name.
func (s *Store) ListPolicies(ctx context.Context, p quota.Page) ([]quota.Policy, *string, error) {
	c, err := decodeCursor(p.Cursor)
	if err != nil {
		return nil, nil, err
	}
	if c.ID != "" && !quota.ValidSlug(c.ID) {
		return nil, nil, quota.FieldError("cursor", "not a cursor of this list")
	}
	rows, err := s.db.Query(ctx, `SELECT spec FROM policies WHERE name COLLATE "C" > $1
		ORDER BY name COLLATE "C" LIMIT $2`, c.ID, p.Limit+1)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list policies: %w", err)
	}
	ps, err := collectPolicies(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: list policies: %w", err)
	}
	items, next := pageOf(ps, p.Limit, func(p quota.Policy) cursor { return cursor{ID: p.Name} })
	return items, next, nil
}

// Policy returns the policy name or a CodeNotFound error.
func (s *Store) Policy(ctx context.Context, name string) (quota.Policy, error) {
	var p quota.Policy
	if !quota.ValidSlug(name) { // no such name can exist: no query
		return p, quota.Errorf(quota.CodeNotFound, "no policy %q", name)
	}
	err := s.db.QueryRow(ctx, `SELECT spec FROM policies WHERE name = $1`, name).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, quota.Errorf(quota.CodeNotFound, "no policy %q", name)
	}
	if err != nil {
		return p, fmt.Errorf("postgres: policy: %w", err)
	}
	return p, nil
}

// lockPoliciesTx takes the policies' write lock and returns every policy.
// The lock (which readers do not wait for) serializes the writes that can
// add matches: each is checked against every other policy
// (checkCrowding), which must not change meanwhile, and a new row is not
// covered by any row lock. Under it a plain read is a read for update.
func lockPoliciesTx(ctx context.Context, tx pgx.Tx) ([]quota.Policy, error) {
	if _, err := tx.Exec(ctx, `LOCK TABLE policies IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return nil, fmt.Errorf("postgres: lock policies: %w", err)
	}
	return policiesTx(ctx, tx)
}

// CreatePolicy fills p's defaults, validates it and inserts it with an
// audit entry. A duplicate name is a CodeConflict error; a policy that
// would make more than quota.MaxPoliciesPerRequest policies apply to one
// request is a CodeInvalid error naming match.
func (s *Store) CreatePolicy(ctx context.Context, actor string, p quota.Policy) (quota.Policy, error) {
	p.Defaults()
	if err := p.Validate(); err != nil {
		return quota.Policy{}, err
	}
	spec, err := json.Marshal(p)
	if err != nil {
		return quota.Policy{}, fmt.Errorf("postgres: encode policy: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		all, err := lockPoliciesTx(ctx, tx)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(all, func(o quota.Policy) bool { return o.Name == p.Name }) {
			return &quota.Error{Code: quota.CodeConflict, Field: "name", Message: fmt.Sprintf("a policy %q exists", p.Name)}
		}
		if err := checkCrowding(&p, all); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO policies (name, spec) VALUES ($1, $2)`, p.Name, spec); err != nil {
			return fmt.Errorf("postgres: insert policy: %w", err)
		}
		return audit(ctx, tx, actor, "create", "policy", p.Name, nil, p)
	})
	if err != nil {
		return quota.Policy{}, err
	}
	return p, nil
}

// UpdatePolicy applies change to the policy name under the policies' write
// lock, fills the defaults of what it removed, validates the result (the
// name cannot change) and stores it with an audit entry, in one
// transaction. A change that changes nothing writes nothing.
func (s *Store) UpdatePolicy(ctx context.Context, actor, name string, change func(*quota.Policy) error) (quota.Policy, error) {
	var out quota.Policy
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		all, err := lockPoliciesTx(ctx, tx)
		if err != nil {
			return err
		}
		i := slices.IndexFunc(all, func(o quota.Policy) bool { return o.Name == name })
		if i < 0 {
			return quota.Errorf(quota.CodeNotFound, "no policy %q", name)
		}
		before := all[i]
		// A deep copy: change may write through the pointers it is given,
		// and before is what the audit entry records.
		after, err := clonePolicy(before)
		if err != nil {
			return err
		}
		if err := change(&after); err != nil {
			return err
		}
		if after.Name != before.Name {
			return quota.FieldError("name", "cannot change; create the policy under the new name and delete this one")
		}
		after.Defaults()
		if err := after.Validate(); err != nil {
			return err
		}
		if err := checkCrowding(&after, all); err != nil {
			return err
		}
		spec, err := json.Marshal(after)
		if err != nil {
			return fmt.Errorf("postgres: encode policy: %w", err)
		}
		out = after
		if same, err := json.Marshal(before); err == nil && bytes.Equal(same, spec) {
			return nil // nothing changes: nothing to write or audit
		}
		if _, err := tx.Exec(ctx, `UPDATE policies SET spec = $2, version = version + 1, updated_at = now() WHERE name = $1`,
			name, spec); err != nil {
			return fmt.Errorf("postgres: update policy: %w", err)
		}
		return audit(ctx, tx, actor, "update", "policy", name, before, after)
	})
	return out, err
}

func clonePolicy(p quota.Policy) (quota.Policy, error) {
	var out quota.Policy
	b, err := json.Marshal(p)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		return out, fmt.Errorf("postgres: copy policy: %w", err)
	}
	return out, nil
}

// DeletePolicy deletes the policy name with an audit entry, or answers a
// CodeNotFound error.
func (s *Store) DeletePolicy(ctx context.Context, actor, name string) error {
	return pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var before quota.Policy
		err := tx.QueryRow(ctx, `DELETE FROM policies WHERE name = $1 RETURNING spec`, name).Scan(&before)
		if errors.Is(err, pgx.ErrNoRows) {
			return quota.Errorf(quota.CodeNotFound, "no policy %q", name)
		}
		if err != nil {
			return fmt.Errorf("postgres: delete policy: %w", err)
		}
		return audit(ctx, tx, actor, "delete", "policy", name, before, nil)
	})
}

// checkCrowding refuses p when, beside the other policies of all, some
// request would match more than quota.MaxPoliciesPerRequest policies: a
// request is decided against all of its policies in one admission script,
// whose arguments are bounded. Only the requests p matches can be new, so
// only they are tried.
func checkCrowding(p *quota.Policy, all []quota.Policy) error {
	set := []*quota.Policy{p}
	for i := range all {
		if all[i].Name != p.Name {
			set = append(set, &all[i])
		}
	}
	if len(set) <= quota.MaxPoliciesPerRequest {
		return nil
	}
	req, crowd := crowded(set)
	if crowd == nil {
		return nil
	}
	names := make([]string, len(crowd))
	for i, q := range crowd {
		names[i] = q.Name
	}
	return quota.FieldError("match", "at most %d policies may apply to one request; %d would apply to a request of %s: %s",
		quota.MaxPoliciesPerRequest, len(crowd), req, strings.Join(names, ", "))
}

// dimension is one part of a request as policies match it: the values
// worth trying, and whether a match accepts one.
type dimension struct {
	name   string
	values []string
	match  func(m *quota.PolicyMatch, v string) bool
}

// requestDimensions lists, for the requests set[0] matches, the values of
// meter, tier, method and path that tell every request apart as the
// policies of set see it. A meter (tier, method) is one some policy lists,
// or "" for any other, which only the policies listing none match; a path
// matches what its longest listed prefix matches, so the listed prefixes
// stand for every path ("" for one under none).
func requestDimensions(set []*quota.Policy) []dimension {
	own := &set[0].Match
	values := func(of func(*quota.PolicyMatch) []string) []string {
		if v := of(own); len(v) > 0 {
			return v
		}
		vals := []string{""}
		for _, q := range set {
			vals = append(vals, of(&q.Match)...)
		}
		slices.Sort(vals)
		return slices.Compact(vals)
	}
	listed := func(list []string, v string) bool { return len(list) == 0 || slices.Contains(list, v) }
	// A path is under a prefix when it is as the most lenient upstream
	// reads both (routes.UnderPrefix): the prefixes are compared in that
	// reading, where /api/a/ and /api/A/ take in the same paths.
	loose := func(m *quota.PolicyMatch) string { return routes.Loose(m.PathPrefix) }
	paths := []string{loose(own)}
	for _, q := range set {
		if l := loose(&q.Match); strings.HasPrefix(l, paths[0]) {
			paths = append(paths, l)
		}
	}
	slices.Sort(paths)
	return []dimension{
		{"meter", values(func(m *quota.PolicyMatch) []string { return m.Meters }),
			func(m *quota.PolicyMatch, v string) bool { return listed(m.Meters, v) }},
		{"tier", values(func(m *quota.PolicyMatch) []string { return m.Tiers }),
			func(m *quota.PolicyMatch, v string) bool { return listed(m.Tiers, v) }},
		{"method", withHead(values(func(m *quota.PolicyMatch) []string { return m.Methods })),
			func(m *quota.PolicyMatch, v string) bool { return m.TakesMethod(v) }},
		{"path", slices.Compact(paths),
			func(m *quota.PolicyMatch, v string) bool { return strings.HasPrefix(v, loose(m)) }},
	}
}

// withHead adds HEAD to a list of methods that holds GET: a policy on GET
// takes HEAD requests too (quota.PolicyMatch.TakesMethod), so HEAD is a
// request of its own to try.
func withHead(methods []string) []string {
	if slices.Contains(methods, "GET") && !slices.Contains(methods, "HEAD") {
		return append(slices.Clip(methods), "HEAD")
	}
	return methods
}

// crowded returns a request that more than MaxPoliciesPerRequest policies
// of set match, described, and those policies; nil when there is none.
// Each dimension narrows the policies down, so a branch ends as soon as
// few enough are left.
func crowded(set []*quota.Policy) (string, []*quota.Policy) {
	dims := requestDimensions(set)
	req := make([]string, len(dims))
	var search func(d int, in []*quota.Policy) []*quota.Policy
	search = func(d int, in []*quota.Policy) []*quota.Policy {
		if len(in) <= quota.MaxPoliciesPerRequest {
			return nil
		}
		if d == len(dims) {
			return in
		}
		for _, v := range dims[d].values {
			var out []*quota.Policy
			for _, q := range in {
				if dims[d].match(&q.Match, v) {
					out = append(out, q)
				}
			}
			if got := search(d+1, out); got != nil {
				req[d] = fmt.Sprintf("%s %q", dims[d].name, v)
				if v == "" {
					req[d] = "any other " + dims[d].name
				}
				return got
			}
		}
		return nil
	}
	crowd := search(0, set)
	return strings.Join(req, ", "), crowd
}
