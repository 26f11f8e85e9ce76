package httpapi

import (
	"bytes"
	"context"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
)

// policyList is the catalog's list of policies, the same on every node
// within a second of a change. The slice and what it points to are never
// modified once returned.
type policyList interface {
	Policies(ctx context.Context) ([]quota.Policy, error)
}

// scopeValues are what a request gives the policies' scopes. The client
// address and the param values are read from req only when a policy of
// that scope matches, so that a request matching none pays nothing for
// them; req is nil for /v1/check, which has no client of its own, no
// request to read and no end to release a slot at (a policy of scope ip or
// param, a concurrency one or an adaptive one does not apply to it: the
// place it took in flight would be held for good). An empty key means the
// request has none.
type scopeValues struct {
	tenant, key string
	req         *fiber.Ctx
	path        string // req's path, as the route table saw it
	// hold: a check (req nil) that takes concurrency leases (Ask.Hold).
	hold bool
}

// policyCalls returns the policies that apply to a metered request, with
// the value of each one's scope and its limit for that value. A param
// policy whose value the request does not carry (no such header, query
// parameter or path segment) does not apply to it. Requests of a node
// without policies allocate nothing here.
func (s *Server) policyCalls(c *fiber.Ctx, p catalog.Principal, route *routes.Route) ([]quota.PolicyCall, error) {
	path := proxyPath(c)
	return s.matchPolicies(c.UserContext(), route.Meter, path, c.Method(), p.Tier.Slug,
		scopeValues{tenant: p.Tenant.ID, key: p.KeyID, req: c, path: path})
}

// matchPolicies returns the policies matching a request of meter, path,
// method and tier with the given scope values. A request without a path
// or method (/v1/check) matches only policies that select neither. A
// request that names no one value for a param policy that matches it is
// refused (paramValue).
func (s *Server) matchPolicies(ctx context.Context, meter, path, method, tier string, v scopeValues) ([]quota.PolicyCall, error) {
	if s.policies == nil {
		return nil, nil
	}
	list, err := s.policies.Policies(ctx)
	if err != nil || len(list) == 0 {
		return nil, err
	}
	var calls []quota.PolicyCall
	for i := range list {
		pol := &list[i]
		if !pol.Match.Matches(meter, path, method, tier, routes.UnderPrefix) {
			continue
		}
		heldInRedis := v.hold && pol.InRedis()
		if v.req == nil && (pol.Algorithm == quota.AlgAdaptive ||
			pol.Algorithm == quota.AlgConcurrency && !heldInRedis) {
			// A check takes no adaptive place (no answer ends it here), and
			// a concurrency lease only when it holds one until a release
			// (Ask.Hold), in Redis: any node may be asked to release it.
			continue
		}
		value, ok := "", true
		switch pol.Scope {
		case quota.ScopeTenant:
			value = v.tenant
		case quota.ScopeKey:
			value, ok = v.key, v.key != ""
		case quota.ScopeIP:
			if ok = v.req != nil; ok {
				value = s.guard.ClientIP(v.req).String()
			}
		case quota.ScopeParam:
			if ok = v.req != nil; ok {
				if value, ok, err = paramValue(v.req, pol, v.path); err != nil {
					return nil, err
				}
			}
		}
		if !ok {
			continue
		}
		limit, _ := pol.LimitFor(value)
		calls = append(calls, quota.PolicyCall{Policy: pol, Value: value, Limit: limit})
		if len(calls) == quota.MaxPoliciesPerRequest {
			break
		}
	}
	return calls, nil
}

// paramValue finds the value a param policy limits by, the one the
// upstream acts on, copied out of Fiber's buffers and cut to
// quota.MaxParamValueLen bytes (a longer one still counts, under its first
// bytes). ok is false when the request carries none (an empty one is none).
//
//   - A path segment is counted as upstreams read it (routes.Segment): empty
//     segments do not count, a ;parameter is not part of the value, escapes
//     are decoded, case is kept. A path upstreams read as different
//     segments there (%2F, %5C or \ at or before it) is refused, naming
//     path.
//   - A header is every header of its name in any case and with _ read as -
//     (one to a CGI-style upstream); a query parameter is every one of its
//     name in any case (one to upstreams that ignore it, such as ASP.NET),
//     name and value decoded. Sent more than once with different values,
//     the request is refused, naming the param: which one an upstream reads
//     is its own choice.
func paramValue(c *fiber.Ctx, pol *quota.Policy, path string) (string, bool, error) {
	src, name, err := quota.ParseParam(pol.Param)
	if err != nil {
		return "", false, nil
	}
	var buf [quota.MaxParamValueLen]byte
	var v []byte
	switch src {
	case quota.ParamHeader, quota.ParamQuery:
		var one oneValue
		if src == quota.ParamHeader {
			c.Request().Header.VisitAll(func(key, value []byte) {
				if headerIs(key, name) {
					one.add(value)
				}
			})
		} else {
			c.Request().URI().QueryArgs().VisitAll(func(key, value []byte) {
				if queryIs(key, name) {
					one.add(value)
				}
			})
		}
		if one.differ {
			return "", false, quota.FieldError(pol.Param, "must be sent once, or with one value each time: policy %s limits by its value", pol.Name)
		}
		v = one.v
	case quota.ParamPath:
		n, _ := strconv.Atoi(name)
		if v, _, err = routes.Segment(buf[:0], path, n); err != nil {
			return "", false, quota.FieldError("path", "must read as one path:%d value to every upstream (policy %s): with %%2F, %%5C or \\ read as / at or before that segment, it reads as another", n, pol.Name)
		}
	}
	if len(v) == 0 {
		return "", false, nil
	}
	if len(v) > quota.MaxParamValueLen {
		v = v[:quota.MaxParamValueLen]
	}
	return string(v), true, nil
}

// queryIs reports whether a query parameter's name (decoded) is name in
// any case of its ASCII letters.
func queryIs(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := range len(key) {
		if lower(key[i]) != lower(name[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// oneValue gathers the values of one header or query parameter sent
// any number of times: the first (aliasing the request's buffers), and
// whether another one differs from it.
type oneValue struct {
	v             []byte
	found, differ bool
}

func (o *oneValue) add(v []byte) {
	if !o.found {
		o.v, o.found = v, true
	} else if !bytes.Equal(o.v, v) {
		o.differ = true
	}
}

// Policy headers and outcomes.
var (
	hdrShadowRefused = httpx.CanonicalHeader("Tollgate-Shadow-Refused")
)

// appendPolicyNames appends the names of the policies of d whose outcome
// is o, comma-separated.
func appendPolicyNames(b []byte, d quota.Decision, o quota.PolicyOutcome) []byte {
	n := 0
	for _, st := range d.Policies {
		if st.Outcome != o {
			continue
		}
		if n > 0 {
			b = append(b, ", "...)
		}
		b = append(b, st.Policy.Name...)
		n++
	}
	return b
}

// writeFallback answers a request a degrade policy refused with the
// policy's fallback (API.md: counted, not charged).
func writeFallback(c *fiber.Ctx, d quota.Decision) error {
	f := d.Fallback.Policy.Fallback
	c.Status(f.Status)
	c.Response().Header.SetContentType(f.ContentType)
	c.Response().Header.SetCanonical(hdrDegraded, []byte(d.Fallback.Policy.Name))
	confineAnswer(&c.Response().Header) // an answer in the upstream's place
	c.Response().SetBodyString(f.Body)
	return nil
}

// countPolicies counts each policy's outcome in /metrics.
func (s *Server) countPolicies(d quota.Decision) {
	for _, st := range d.Policies {
		s.metrics.Policies.WithLabelValues(st.Policy.Name, string(st.Policy.Algorithm), st.Outcome.String()).Inc()
	}
}

// waitDelay holds an admitted request for its leaky_bucket slot (d.Delay),
// or until ctx ends.
func waitDelay(ctx context.Context, d quota.Decision) {
	if d.Delay <= 0 {
		return
	}
	t := time.NewTimer(d.Delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
