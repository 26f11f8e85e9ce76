package quota

import (
	"errors"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Algorithm names a policy's rate-limiting algorithm (API.md "Policies").
type Algorithm string

// The algorithms of a policy.
const (
	AlgFixedWindow   Algorithm = "fixed_window"   // a counter per aligned window
	AlgSlidingLog    Algorithm = "sliding_log"    // a log of admissions: exact
	AlgSlidingWindow Algorithm = "sliding_window" // sub-window counters, weighted
	AlgTokenBucket   Algorithm = "token_bucket"   // capacity, refill per second
	AlgGCRA          Algorithm = "gcra"           // rate, burst
	AlgLeakyBucket   Algorithm = "leaky_bucket"   // nginx limit_req: rate, burst, shaping
	AlgConcurrency   Algorithm = "concurrency"    // a semaphore with leases
	AlgWarmUp        Algorithm = "warm_up"        // Guava SmoothWarmingUp
	AlgAdaptive      Algorithm = "adaptive"       // node-local shedding (Sentinel BBR)
)

// Algorithms lists every algorithm, in the order of the table in docs/concepts/limits.md.
var Algorithms = []Algorithm{AlgFixedWindow, AlgSlidingLog, AlgSlidingWindow,
	AlgTokenBucket, AlgGCRA, AlgLeakyBucket, AlgConcurrency, AlgWarmUp, AlgAdaptive}

// Scope says whose requests share one instance of a policy's state.
type Scope string

// The scopes of a policy.
const (
	ScopeTenant Scope = "tenant" // per tenant (the default)
	ScopeKey    Scope = "key"    // per API key
	ScopeIP     Scope = "ip"     // per client address
	ScopeGlobal Scope = "global" // all tenants together
	ScopeNode   Scope = "node"   // each API node on its own, in-process
	ScopeParam  Scope = "param"  // per distinct value of a header, query or path segment, per tenant
)

// PolicyCost says what a policy counts.
type PolicyCost string

// What a policy counts.
const (
	CostRequests PolicyCost = "requests" // 1 per request (the default)
	CostUnits    PolicyCost = "units"    // the route's cost
)

// OnRefuse says what happens to a request a policy refuses.
type OnRefuse string

// What a policy does with a request it refuses.
const (
	RefuseReject  OnRefuse = "reject"  // 429 (the default)
	RefuseQueue   OnRefuse = "queue"   // wait up to MaxWaitMS, then 429
	RefuseShadow  OnRefuse = "shadow"  // never refuse; count and report the refusal
	RefuseDegrade OnRefuse = "degrade" // answer the fallback, counted, not charged
)

// PolicyMatch selects the requests a policy applies to; an empty list
// matches everything.
type PolicyMatch struct {
	Meters     []string `json:"meters,omitempty"`
	PathPrefix string   `json:"path_prefix,omitempty"`
	Methods    []string `json:"methods,omitempty"`
	Tiers      []string `json:"tiers,omitempty"`
}

// Fallback is the answer of a degrade policy.
type Fallback struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type"`
	Body        string `json:"body"`
}

// Policy is an extra limit beside a tier's four (API.md "Policies (v2)").
// The algorithm's fields are pointers: a field the algorithm does not use
// must be absent, one it needs must be set (Validate).
type Policy struct {
	Name      string    `json:"name"`
	Algorithm Algorithm `json:"algorithm"`

	Limit           *int64   `json:"limit,omitempty"`             // fixed_window, sliding_log, sliding_window, concurrency
	WindowSeconds   *int64   `json:"window_seconds,omitempty"`    // fixed_window, sliding_log, sliding_window
	Buckets         *int64   `json:"buckets,omitempty"`           // sliding_window
	Capacity        *int64   `json:"capacity,omitempty"`          // token_bucket
	RefillPerSec    *float64 `json:"refill_per_sec,omitempty"`    // token_bucket
	Rate            *float64 `json:"rate,omitempty"`              // gcra, leaky_bucket, warm_up
	Burst           *int64   `json:"burst,omitempty"`             // gcra, leaky_bucket
	LeaseSeconds    *int64   `json:"lease_seconds,omitempty"`     // concurrency
	WarmupSeconds   *int64   `json:"warmup_seconds,omitempty"`    // warm_up
	ColdFactor      *int64   `json:"cold_factor,omitempty"`       // warm_up (default 3)
	MaxConcurrency  *int64   `json:"max_concurrency,omitempty"`   // adaptive
	TargetLatencyMS *int64   `json:"target_latency_ms,omitempty"` // adaptive

	Match      PolicyMatch      `json:"match"`
	Scope      Scope            `json:"scope"`
	Param      string           `json:"param,omitempty"`
	Exceptions map[string]int64 `json:"exceptions,omitempty"`
	Cost       PolicyCost       `json:"cost"`
	OnRefuse   OnRefuse         `json:"on_refuse"`
	MaxWaitMS  *int64           `json:"max_wait_ms,omitempty"`
	Fallback   *Fallback        `json:"fallback,omitempty"`
}

// Bounds of policy values. Each keeps what the admission script computes an
// exact integer in a Lua double (below 2^53): see the algorithms in
// lua/policy_*.lua.
const (
	MaxPolicyWindowSeconds = 366 * 86400 // a window of at most a leap year
	MaxSlidingLogLimit     = 100_000     // entries of a sliding log (its memory)
	MaxBuckets             = 3600        // sub-windows of a sliding window
	MaxConcurrencyLimit    = 100_000     // slots of a concurrency policy
	MaxLeaseSeconds        = 86400
	MaxWarmupSeconds       = 3600
	MaxColdFactor          = 100
	MaxWaitMS              = 60_000 // a queued request waits at most a minute
	MaxTargetLatencyMS     = 60_000
	MaxExceptions          = 100
	MaxParamValueLen       = 256
	MaxFallbackBody        = 16 << 10
	// MaxPoliciesPerRequest bounds the policies one request is decided
	// against (the script's arguments); more matching ones is a
	// configuration error refused when the policy is created.
	MaxPoliciesPerRequest = 16
)

// Defaults fills the optional fields a client left out: scope tenant, cost
// requests, on_refuse reject, and warm_up's cold_factor 3.
func (p *Policy) Defaults() {
	if p.Scope == "" {
		p.Scope = ScopeTenant
	}
	if p.Cost == "" {
		p.Cost = CostRequests
	}
	if p.OnRefuse == "" {
		p.OnRefuse = RefuseReject
	}
	if p.Algorithm == AlgWarmUp && p.ColdFactor == nil {
		p.ColdFactor = Ptr(int64(3))
	}
	if p.Algorithm == AlgAdaptive && p.Scope == ScopeTenant {
		// an adaptive policy sheds its node's load: node is its one scope
		p.Scope = ScopeNode
	}
}

// field is one algorithm field: its JSON name and whether it is set.
type field struct {
	name string
	set  bool
}

func (p *Policy) fields() []field {
	return []field{
		{"limit", p.Limit != nil}, {"window_seconds", p.WindowSeconds != nil},
		{"buckets", p.Buckets != nil}, {"capacity", p.Capacity != nil},
		{"refill_per_sec", p.RefillPerSec != nil}, {"rate", p.Rate != nil},
		{"burst", p.Burst != nil}, {"lease_seconds", p.LeaseSeconds != nil},
		{"warmup_seconds", p.WarmupSeconds != nil}, {"cold_factor", p.ColdFactor != nil},
		{"max_concurrency", p.MaxConcurrency != nil}, {"target_latency_ms", p.TargetLatencyMS != nil},
	}
}

// algorithmFields lists the fields each algorithm takes; every one of them
// is required (cold_factor has a default, set by Defaults).
var algorithmFields = map[Algorithm][]string{
	AlgFixedWindow:   {"limit", "window_seconds"},
	AlgSlidingLog:    {"limit", "window_seconds"},
	AlgSlidingWindow: {"limit", "window_seconds", "buckets"},
	AlgTokenBucket:   {"capacity", "refill_per_sec"},
	AlgGCRA:          {"rate", "burst"},
	AlgLeakyBucket:   {"rate", "burst"},
	AlgConcurrency:   {"limit", "lease_seconds"},
	AlgWarmUp:        {"rate", "warmup_seconds", "cold_factor"},
	AlgAdaptive:      {"max_concurrency", "target_latency_ms"},
}

// CanQueue reports whether a refusal of the algorithm can turn into a wait:
// every algorithm that knows when room comes back. adaptive sheds load now;
// making its refusals wait would add the load it sheds.
func (a Algorithm) CanQueue() bool { return a != AlgAdaptive && a != "" }

// InRedis reports whether the policy's state lives in Redis: every scope
// but node, and every algorithm but adaptive (node-local by nature).
func (p *Policy) InRedis() bool { return p.Scope != ScopeNode && p.Algorithm != AlgAdaptive }

// InTenantSlot reports whether the policy's state lives under the tenant's
// hash tag, so that it is decided in the admission script itself; global and
// ip policies are decided by a reservation in their own slot.
func (p *Policy) InTenantSlot() bool {
	return p.InRedis() && (p.Scope == ScopeTenant || p.Scope == ScopeKey || p.Scope == ScopeParam)
}

// Validate checks p (after Defaults) and returns a CodeInvalid *Error naming
// the first bad field.
func (p *Policy) Validate() error {
	if !ValidSlug(p.Name) {
		return FieldError("name", "must be 1 to 63 lowercase letters, digits or inner hyphens")
	}
	want, ok := algorithmFields[p.Algorithm]
	if !ok {
		return FieldError("algorithm", "must be one of %s", algorithmList())
	}
	for _, f := range p.fields() {
		needed := contains(want, f.name)
		if needed && !f.set {
			return FieldError(f.name, "is required by %s", p.Algorithm)
		}
		if !needed && f.set {
			return FieldError(f.name, "is not a field of %s", p.Algorithm)
		}
	}
	if err := p.validateNumbers(); err != nil {
		return err
	}
	if err := p.validateScope(); err != nil {
		return err
	}
	if err := p.Match.validate(); err != nil {
		return err
	}
	switch p.Cost {
	case CostRequests:
	case CostUnits:
		if p.Algorithm == AlgConcurrency || p.Algorithm == AlgAdaptive {
			return FieldError("cost", `%s counts requests in flight: cost must be "requests"`, p.Algorithm)
		}
	default:
		return FieldError("cost", `must be "requests" or "units"`)
	}
	return p.validateRefusal()
}

func (p *Policy) validateNumbers() error {
	count := func(name string, v *int64, lo, hi int64) error {
		if v != nil && (*v < lo || *v > hi) {
			return FieldError(name, "must be an integer between %d and %d", lo, hi)
		}
		return nil
	}
	rate := func(name string, v *float64) error {
		if v != nil {
			return checkRate(name, *v)
		}
		return nil
	}
	limitMax := MaxQuantity
	switch p.Algorithm {
	case AlgSlidingLog:
		limitMax = MaxSlidingLogLimit
	case AlgConcurrency:
		limitMax = MaxConcurrencyLimit
	}
	for _, err := range []error{
		count("limit", p.Limit, 1, limitMax),
		count("window_seconds", p.WindowSeconds, 1, MaxPolicyWindowSeconds),
		count("buckets", p.Buckets, 1, MaxBuckets),
		count("capacity", p.Capacity, 1, MaxQuantity),
		rate("refill_per_sec", p.RefillPerSec),
		rate("rate", p.Rate),
		count("burst", p.Burst, 0, MaxQuantity),
		count("lease_seconds", p.LeaseSeconds, 1, MaxLeaseSeconds),
		count("warmup_seconds", p.WarmupSeconds, 1, MaxWarmupSeconds),
		count("cold_factor", p.ColdFactor, 2, MaxColdFactor),
		count("max_concurrency", p.MaxConcurrency, 1, MaxConcurrencyLimit),
		count("target_latency_ms", p.TargetLatencyMS, 1, MaxTargetLatencyMS),
	} {
		if err != nil {
			return err
		}
	}
	switch p.Algorithm {
	case AlgGCRA:
		if *p.Burst < 1 {
			return FieldError("burst", "must be at least 1 for gcra")
		}
		fallthrough
	case AlgLeakyBucket:
		if *p.Burst+1 > MaxWindowMicros/IntervalMicros(*p.Rate) {
			return FieldError("burst", "burst / rate must be at most %d seconds", MaxWindowMicros/1e6)
		}
	case AlgTokenBucket:
		if *p.Capacity > MaxWindowMicros/IntervalMicros(*p.RefillPerSec) {
			return FieldError("capacity", "capacity / refill_per_sec must be at most %d seconds", MaxWindowMicros/1e6)
		}
	case AlgSlidingWindow:
		us := *p.WindowSeconds * 1e6
		if us%*p.Buckets != 0 {
			return FieldError("buckets", "must divide the window into whole microseconds")
		}
		// the weighted count multiplies a bucket's count by a time in the
		// bucket: limit × bucket length must stay below 2^52
		if *p.Limit > (int64(1)<<52)/(us / *p.Buckets) {
			return FieldError("limit", "limit × window_seconds / buckets must be below %d µs", int64(1)<<52)
		}
	case AlgWarmUp:
		if IntervalMicros(*p.Rate)*(*p.ColdFactor) > MaxWindowMicros>>10 {
			return FieldError("rate", "rate / cold_factor is too slow to warm up")
		}
	}
	return nil
}

func (p *Policy) validateScope() error {
	switch p.Scope {
	case ScopeTenant, ScopeKey, ScopeIP, ScopeGlobal, ScopeNode:
		if p.Param != "" {
			return FieldError("param", `is only for scope "param"`)
		}
		if len(p.Exceptions) > 0 {
			return FieldError("exceptions", `are only for scope "param"`)
		}
	case ScopeParam:
		if _, _, err := ParseParam(p.Param); err != nil {
			return err
		}
		if len(p.Exceptions) > MaxExceptions {
			return FieldError("exceptions", "at most %d", MaxExceptions)
		}
		if len(p.Exceptions) > 0 && p.primaryLimit() == nil {
			return FieldError("exceptions", "%s has no single limit to replace", p.Algorithm)
		}
		for v, n := range p.Exceptions {
			if v == "" || len(v) > MaxParamValueLen || !printable(v) {
				return FieldError("exceptions", "values must be 1 to %d bytes of UTF-8 without control characters", MaxParamValueLen)
			}
			// an exception replaces the primary limit: it is held to the
			// same bounds (a copy of the policy with it must be valid)
			q := *p
			q.Exceptions = nil
			switch q.Algorithm {
			case AlgFixedWindow, AlgSlidingLog, AlgSlidingWindow, AlgConcurrency:
				q.Limit = Ptr(n)
			case AlgTokenBucket:
				q.Capacity = Ptr(n)
			case AlgGCRA, AlgLeakyBucket:
				q.Burst = Ptr(n)
			}
			if err := q.validateNumbers(); err != nil || n < 0 {
				msg := "limits must be within the bounds of the policy's own limit"
				if e := (*Error)(nil); errors.As(err, &e) {
					msg += ": " + e.Message
				}
				return FieldError("exceptions", "%s", msg)
			}
		}
	default:
		return FieldError("scope", "must be one of tenant, key, ip, global, node, param")
	}
	if p.Algorithm == AlgAdaptive && p.Scope != ScopeNode {
		return FieldError("scope", `adaptive sheds the load of this node: scope must be "node"`)
	}
	return nil
}

// primaryLimit is the limit an exception replaces: limit, capacity or
// burst, by algorithm.
func (p *Policy) primaryLimit() *int64 {
	switch p.Algorithm {
	case AlgFixedWindow, AlgSlidingLog, AlgSlidingWindow, AlgConcurrency:
		return p.Limit
	case AlgTokenBucket:
		return p.Capacity
	case AlgGCRA, AlgLeakyBucket:
		return p.Burst
	}
	return nil
}

func (p *Policy) validateRefusal() error {
	switch p.OnRefuse {
	case RefuseReject, RefuseShadow:
	case RefuseQueue:
		if !p.Algorithm.CanQueue() {
			return FieldError("on_refuse", `%s cannot wait: use "reject", "shadow" or "degrade"`, p.Algorithm)
		}
		if p.MaxWaitMS == nil {
			return FieldError("max_wait_ms", `is required by on_refuse "queue"`)
		}
		if *p.MaxWaitMS < 1 || *p.MaxWaitMS > MaxWaitMS {
			return FieldError("max_wait_ms", "must be an integer between 1 and %d", MaxWaitMS)
		}
	case RefuseDegrade:
		f := p.Fallback
		if f == nil {
			return FieldError("fallback", `is required by on_refuse "degrade"`)
		}
		if f.Status < 200 || f.Status > 599 {
			return FieldError("fallback", "status must be between 200 and 599")
		}
		if f.ContentType == "" || len(f.ContentType) > 200 || !printable(f.ContentType) {
			return FieldError("fallback", "content_type must be 1 to 200 printable characters")
		}
		if len(f.Body) > MaxFallbackBody || !utf8.ValidString(f.Body) || strings.ContainsRune(f.Body, 0) {
			return FieldError("fallback", "body must be at most %d bytes of UTF-8 without NUL", MaxFallbackBody)
		}
	default:
		return FieldError("on_refuse", "must be one of reject, queue, shadow, degrade")
	}
	if p.OnRefuse != RefuseQueue && p.MaxWaitMS != nil {
		return FieldError("max_wait_ms", `is only for on_refuse "queue"`)
	}
	if p.OnRefuse != RefuseDegrade && p.Fallback != nil {
		return FieldError("fallback", `is only for on_refuse "degrade"`)
	}
	return nil
}

func (m *PolicyMatch) validate() error {
	for _, s := range m.Meters {
		if s == "" || len(s) > 64 || strings.ContainsAny(s, "|,") || !printable(s) {
			return FieldError("match", "meters must be 1 to 64 characters without '|' or ','")
		}
	}
	for _, s := range m.Tiers {
		if !ValidSlug(s) {
			return FieldError("match", "tiers must be tier slugs")
		}
	}
	for i, s := range m.Methods {
		u := strings.ToUpper(s)
		switch u {
		case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS":
			m.Methods[i] = u
		default:
			return FieldError("match", "methods must be HTTP methods (GET, POST, ...)")
		}
	}
	// A ;parameter is what upstreams drop from a segment: a prefix read
	// without it would take in paths it does not name.
	if m.PathPrefix != "" && (!strings.HasPrefix(m.PathPrefix, "/") || len(m.PathPrefix) > 512 ||
		strings.Contains(m.PathPrefix, "..") || strings.Contains(m.PathPrefix, ";") || !utf8.ValidString(m.PathPrefix)) {
		return FieldError("match", "path_prefix must start with / and hold no dot segments or ;parameters")
	}
	if len(m.Meters) > 64 || len(m.Tiers) > 64 || len(m.Methods) > 16 {
		return FieldError("match", "too many entries")
	}
	return nil
}

// Matches reports whether a request of the meter, path, method and tier is
// one the policy applies to. under says whether the request's path falls
// under the path_prefix: that is a question of how upstreams read paths,
// which the route table answers (routes.UnderPrefix).
func (m *PolicyMatch) Matches(meter, path, method, tier string, under func(path, prefix string) bool) bool {
	if len(m.Meters) > 0 && !contains(m.Meters, meter) {
		return false
	}
	if len(m.Tiers) > 0 && !contains(m.Tiers, tier) {
		return false
	}
	if !m.TakesMethod(method) {
		return false
	}
	return m.PathPrefix == "" || under(path, m.PathPrefix)
}

// TakesMethod reports whether the match's methods take in a request of
// method. A policy on GET takes HEAD too: upstreams answer HEAD by doing
// GET's work and dropping the body.
func (m *PolicyMatch) TakesMethod(method string) bool {
	return len(m.Methods) == 0 || contains(m.Methods, method) || method == "HEAD" && contains(m.Methods, "GET")
}

// ParamSource says where a param scope finds its value.
type ParamSource string

// The sources of a param scope's value.
const (
	ParamHeader ParamSource = "header"
	ParamQuery  ParamSource = "query"
	ParamPath   ParamSource = "path"
)

// ParseParam splits "header:<name>", "query:<name>" or "path:<segment
// index>" (0-based, after the leading /).
func ParseParam(s string) (ParamSource, string, error) {
	src, name, ok := strings.Cut(s, ":")
	if !ok || name == "" || len(name) > 128 {
		return "", "", badParam()
	}
	switch ParamSource(src) {
	case ParamHeader, ParamQuery:
		for _, r := range name {
			if r <= ' ' || r >= 0x7f || strings.ContainsRune(`()<>@,;:\"/[]?={}`, r) {
				return "", "", badParam()
			}
		}
	case ParamPath:
		if n, err := strconv.Atoi(name); err != nil || n < 0 || n > 64 {
			return "", "", badParam()
		}
	default:
		return "", "", badParam()
	}
	return ParamSource(src), name, nil
}

// badParam is ParseParam's error, made only when there is one: the metered
// path parses a valid param on every request a param policy matches.
func badParam() error {
	return FieldError("param", `must be "header:<name>", "query:<name>" or "path:<segment index>"`)
}

// LimitFor returns the policy's primary limit for a param value: the
// exception's when the value has one.
func (p *Policy) LimitFor(value string) (int64, bool) {
	if n, ok := p.Exceptions[value]; ok {
		return n, true
	}
	if l := p.primaryLimit(); l != nil {
		return *l, false
	}
	return 0, false
}

// WindowSecondsOf is the w of the policy's RateLimit-Policy item: its window
// where it has one (the windowed algorithms; burst over rate for the rate
// ones), 0 where it has none (concurrency, warm_up, adaptive).
func (p *Policy) WindowSecondsOf() int64 {
	switch p.Algorithm {
	case AlgFixedWindow, AlgSlidingLog, AlgSlidingWindow:
		return *p.WindowSeconds
	case AlgTokenBucket:
		return CeilSeconds(time.Duration(*p.Capacity*IntervalMicros(*p.RefillPerSec)) * time.Microsecond)
	case AlgGCRA, AlgLeakyBucket:
		return CeilSeconds(time.Duration((*p.Burst+1)*IntervalMicros(*p.Rate)) * time.Microsecond)
	}
	return 0
}

func algorithmList() string {
	s := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		s[i] = string(a)
	}
	return strings.Join(s, ", ")
}

// printable reports whether s is UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// PolicyCall is one policy instance a request is decided against: the
// policy, the value of its scope (a tenant id, key id, client address or
// param value; "" for global and node) and its limit for that value (an
// exception's for a hot param value).
type PolicyCall struct {
	Policy *Policy
	Value  string
	Limit  int64
}

// PolicyOutcome is what a policy made of a request.
type PolicyOutcome int8

// What a policy made of a request.
const (
	PolicyRefused       PolicyOutcome = 0 // the request is refused (reject, queue)
	PolicyAdmitted      PolicyOutcome = 1
	PolicyShadowRefused PolicyOutcome = 2 // it would have refused; the request goes on
	PolicyDegraded      PolicyOutcome = 3 // the request gets the fallback answer
)

// PolicyOutcomeOf is the outcome numbered v in a script's answer; a number
// that names no outcome reads as PolicyRefused, the outcome that lets
// nothing through.
func PolicyOutcomeOf(v int64) PolicyOutcome {
	if v < int64(PolicyRefused) || v > int64(PolicyDegraded) {
		return PolicyRefused
	}
	return PolicyOutcome(v)
}

// String names the outcome as /metrics and logs do.
func (o PolicyOutcome) String() string {
	switch o {
	case PolicyRefused:
		return "refused"
	case PolicyAdmitted:
		return "admitted"
	case PolicyShadowRefused:
		return "shadow_refused"
	case PolicyDegraded:
		return "degraded"
	}
	return "unknown"
}

// PolicyState is one policy's part of a decision, in the order of the
// request's Policies.
type PolicyState struct {
	Policy     *Policy
	Outcome    PolicyOutcome
	Limit      int64
	Remaining  int64
	Reset      time.Time
	Window     time.Duration // the RateLimit-Policy w: 0 when it has none
	RetryAfter time.Duration // when it refused: the wait that suffices; negative never
	Delay      time.Duration // when it admitted: the wait before the request proceeds (leaky_bucket queue)
	// Started is when an adaptive policy took the request into its
	// flight (node-local time): its latency is measured from it.
	Started time.Time
}

// Enforced reports whether the policy's item belongs in the RateLimit
// headers: every policy but a shadow one.
func (s PolicyState) Enforced() bool { return s.Policy.OnRefuse != RefuseShadow }
