package pages

// The console's policies (API.md "Policies (v2)"): a list, a creation
// form and an editor for each, whose every write goes through the catalog
// (so every node applies it within a second) with the actor "console",
// validated exactly as the admin API validates a policy; and the tenant's
// dashboard section listing the policies of its tier with their state, the
// numbers of GET /v1/usage.

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/usage"
)

// policyNumberFields are the algorithms' fields, in the editor's order,
// each with the algorithms that take it (quota.Policy.Validate requires
// exactly these), its label, hint and whether it is a rate (a decimal).
var policyNumberFields = []struct {
	name, label, hint string
	algorithms        []quota.Algorithm
	rate              bool
}{
	{"limit", "Limit", "Requests (or cost units) per window; for concurrency, requests in flight at once.",
		[]quota.Algorithm{quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgSlidingWindow, quota.AlgConcurrency}, false},
	{"window_seconds", "Window (seconds)", "The window the limit counts over.",
		[]quota.Algorithm{quota.AlgFixedWindow, quota.AlgSlidingLog, quota.AlgSlidingWindow}, false},
	{"buckets", "Buckets", "Sub-windows of the sliding window; they must divide it into whole microseconds.",
		[]quota.Algorithm{quota.AlgSlidingWindow}, false},
	{"capacity", "Capacity", "Tokens the bucket holds when full.",
		[]quota.Algorithm{quota.AlgTokenBucket}, false},
	{"refill_per_sec", "Refill (tokens per second)", "A number such as 0.5 or 10.",
		[]quota.Algorithm{quota.AlgTokenBucket}, true},
	{"rate", "Rate (per second)", "The steady rate, a number such as 0.5 or 10.",
		[]quota.Algorithm{quota.AlgGCRA, quota.AlgLeakyBucket, quota.AlgWarmUp}, true},
	{"burst", "Burst", "Requests allowed beyond the rate.",
		[]quota.Algorithm{quota.AlgGCRA, quota.AlgLeakyBucket}, false},
	{"lease_seconds", "Lease (seconds)", "A slot held by a node that died is freed after this long.",
		[]quota.Algorithm{quota.AlgConcurrency}, false},
	{"warmup_seconds", "Warm-up (seconds)", "How long the rate takes to climb back after idleness.",
		[]quota.Algorithm{quota.AlgWarmUp}, false},
	{"cold_factor", "Cold factor", "A cold start allows rate / cold factor; empty is 3.",
		[]quota.Algorithm{quota.AlgWarmUp}, false},
	{"max_concurrency", "Max concurrency", "Requests in flight on one node at most.",
		[]quota.Algorithm{quota.AlgAdaptive}, false},
	{"target_latency_ms", "Target latency (ms)", "Shedding starts when the latency is above it.",
		[]quota.Algorithm{quota.AlgAdaptive}, false},
}

// policyFormFields are the editor's fields besides the algorithm's numbers
// and the textareas; "name" only when creating.
var policyFormFields = []string{csrfField, "algorithm", "match_meters", "match_path_prefix", "match_methods",
	"match_tiers", "scope", "param", "cost", "on_refuse", "max_wait_ms", "fallback_status", "fallback_content_type"}

// policyTextFields are the editor's textareas, with their lengths in
// bytes as submitted (a browser sends each line break as CR LF).
var policyTextFields = map[string]int{
	"exceptions":    quota.MaxExceptions * (quota.MaxParamValueLen + 32),
	"fallback_body": 2 * quota.MaxFallbackBody,
}

func readPolicyForm(c *fiber.Ctx, create bool) (map[string]string, error) {
	fields := slices.Clone(policyFormFields)
	if create {
		fields = append(fields, "name")
	}
	for _, f := range policyNumberFields {
		fields = append(fields, f.name)
	}
	return readFormText(c, policyTextFields, fields...)
}

// policyFromForm parses the editor's fields into a policy; errors go to
// errs by field. quota.Policy.Validate, run by the store, checks the values
// themselves. A field left empty is absent.
func policyFromForm(errs formErrors, f map[string]string) quota.Policy {
	p := quota.Policy{Name: strings.TrimSpace(f["name"]), Algorithm: quota.Algorithm(f["algorithm"]),
		Scope: quota.Scope(f["scope"]), Param: strings.TrimSpace(f["param"]), Cost: quota.PolicyCost(f["cost"]),
		OnRefuse: quota.OnRefuse(f["on_refuse"]),
		Match: quota.PolicyMatch{Meters: listField(f["match_meters"]), PathPrefix: strings.TrimSpace(f["match_path_prefix"]),
			Methods: listField(f["match_methods"]), Tiers: listField(f["match_tiers"])}}
	ints := map[string]**int64{"limit": &p.Limit, "window_seconds": &p.WindowSeconds, "buckets": &p.Buckets,
		"capacity": &p.Capacity, "burst": &p.Burst, "lease_seconds": &p.LeaseSeconds, "warmup_seconds": &p.WarmupSeconds,
		"cold_factor": &p.ColdFactor, "max_concurrency": &p.MaxConcurrency, "target_latency_ms": &p.TargetLatencyMS}
	rates := map[string]**float64{"refill_per_sec": &p.RefillPerSec, "rate": &p.Rate}
	for _, nf := range policyNumberFields {
		if nf.rate {
			*rates[nf.name] = rateField(errs, f, nf.name)
		} else {
			*ints[nf.name] = intField(errs, f, nf.name, true)
		}
	}
	p.MaxWaitMS = intField(errs, f, "max_wait_ms", true)
	p.Exceptions = exceptionsField(errs, f["exceptions"])
	if strings.TrimSpace(f["fallback_status"]) != "" || strings.TrimSpace(f["fallback_content_type"]) != "" || f["fallback_body"] != "" {
		fb := &quota.Fallback{ContentType: strings.TrimSpace(f["fallback_content_type"]), Body: oneLineBreak(f["fallback_body"])}
		if st := intField(errs, f, "fallback_status", false); st != nil {
			if *st < 0 || *st > 999 {
				errs.add(quota.FieldError("fallback_status", "must be between 200 and 599"))
			} else {
				fb.Status = int(*st)
			}
		}
		p.Fallback = fb
	}
	return p
}

// listField splits a comma-separated list, dropping empty entries; nil
// when there is none.
func listField(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// oneLineBreak writes every line break as LF: a browser sends a textarea's
// as CR LF.
func oneLineBreak(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
}

// exceptionsField parses the exceptions textarea: one value=limit a line
// (the last = splits, so a value may hold one), blank lines ignored; nil
// when there is none.
func exceptionsField(errs formErrors, v string) map[string]int64 {
	var out map[string]int64
	for i, line := range strings.Split(oneLineBreak(v), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		eq := strings.LastIndexByte(line, '=')
		if eq < 0 {
			errs.add(quota.FieldError("exceptions", "line %d: write value=limit, one a line", i+1))
			return nil
		}
		value, raw := strings.TrimSpace(line[:eq]), strings.TrimSpace(line[eq+1:])
		if thousands.MatchString(raw) {
			raw = strings.ReplaceAll(raw, ",", "")
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			errs.add(quota.FieldError("exceptions", "line %d: the limit must be a whole number", i+1))
			return nil
		}
		if _, dup := out[value]; dup {
			errs.add(quota.FieldError("exceptions", "line %d: %q is given twice", i+1, value))
			return nil
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[value] = n
	}
	return out
}

// policyValues writes a policy as the editor's field values; an absent
// field is "".
func policyValues(p quota.Policy) map[string]string {
	i := func(v *int64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatInt(*v, 10)
	}
	f := func(v *float64) string {
		if v == nil {
			return ""
		}
		return strconv.FormatFloat(*v, 'f', -1, 64)
	}
	v := map[string]string{
		"name": p.Name, "algorithm": string(p.Algorithm), "limit": i(p.Limit), "window_seconds": i(p.WindowSeconds),
		"buckets": i(p.Buckets), "capacity": i(p.Capacity), "refill_per_sec": f(p.RefillPerSec), "rate": f(p.Rate),
		"burst": i(p.Burst), "lease_seconds": i(p.LeaseSeconds), "warmup_seconds": i(p.WarmupSeconds),
		"cold_factor": i(p.ColdFactor), "max_concurrency": i(p.MaxConcurrency), "target_latency_ms": i(p.TargetLatencyMS),
		"match_meters": strings.Join(p.Match.Meters, ", "), "match_path_prefix": p.Match.PathPrefix,
		"match_methods": strings.Join(p.Match.Methods, ", "), "match_tiers": strings.Join(p.Match.Tiers, ", "),
		"scope": string(p.Scope), "param": p.Param, "exceptions": exceptionLines(p.Exceptions),
		"cost": string(p.Cost), "on_refuse": string(p.OnRefuse), "max_wait_ms": i(p.MaxWaitMS),
	}
	if fb := p.Fallback; fb != nil {
		v["fallback_status"], v["fallback_content_type"], v["fallback_body"] = strconv.Itoa(fb.Status), fb.ContentType, fb.Body
	}
	return v
}

// exceptionLines writes exceptions as value=limit lines, by value.
func exceptionLines(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d\n", k, m[k])
	}
	return b.String()
}

// addPolicyError puts a validation error beside its field. The domain
// names the match and the fallback as a whole; the message says which of
// their parts is at fault ("meters must be ...", "status must be ..."),
// which is the form's field. What names no part is shown on the group.
func addPolicyError(errs formErrors, err error) {
	var qe *quota.Error
	if errors.As(err, &qe) && (qe.Field == "match" || qe.Field == "fallback") {
		parts := map[string][]string{"match": {"meters", "path_prefix", "methods", "tiers"},
			"fallback": {"status", "content_type", "body"}}[qe.Field]
		for _, part := range parts {
			if strings.HasPrefix(qe.Message, part+" ") {
				errs.add(&quota.Error{Code: qe.Code, Field: qe.Field + "_" + part, Message: qe.Message})
				return
			}
		}
	}
	errs.add(err)
}

// ---- the views

// option is one choice of a select.
type option struct{ Value, Label string }

// policyInput is one control of the policy editor.
type policyInput struct {
	Name, Label, Hint, Value, Error string
	Kind                            string // "number", "text", "textarea" or "select"
	Step                            string // of a number: "1" or "any"
	Options                         []option
	// When names the control and values that show this one (data-when),
	// "algorithm=gcra,leaky_bucket": the page's script hides and disables
	// it otherwise, so that it is not sent; without the script it shows.
	When string
}

// policyGroup is one fieldset of the editor; Error is the error of the
// whole group (the match, the fallback).
type policyGroup struct {
	ID, Legend, Error, When string
	Inputs                  []policyInput
}

// policyFormView is the policy editor: the values as typed and an error
// beside each field that has one.
type policyFormView struct {
	Create bool
	Name   string
	Groups []policyGroup
	Errors formErrors
}

var (
	algorithmOptions = []option{
		{"fixed_window", "fixed_window: a counter per aligned window"},
		{"sliding_log", "sliding_log: a log of admissions (exact)"},
		{"sliding_window", "sliding_window: weighted sub-window counters"},
		{"token_bucket", "token_bucket: capacity, refill per second"},
		{"gcra", "gcra: rate and burst"},
		{"leaky_bucket", "leaky_bucket: rate and burst (nginx limit_req)"},
		{"concurrency", "concurrency: requests in flight"},
		{"warm_up", "warm_up: a rate that climbs after idleness"},
		{"adaptive", "adaptive: node-local load shedding"},
	}
	scopeOptions = []option{
		{"tenant", "tenant: each tenant its own"}, {"key", "key: each API key its own"},
		{"ip", "ip: each client address its own"}, {"global", "global: all tenants together"},
		{"node", "node: each API node on its own"}, {"param", "param: each value of a header, query or path segment"},
	}
	costOptions     = []option{{"requests", "requests: 1 per request"}, {"units", "units: the route's cost"}}
	onRefuseOptions = []option{
		{"reject", "reject: answer 429"}, {"queue", "queue: wait up to max_wait_ms, then 429"},
		{"shadow", "shadow: never refuse, only count and report"}, {"degrade", "degrade: answer the fallback"},
	}
)

// newPolicyForm lays out the editor with values and errors.
func newPolicyForm(create bool, name string, v map[string]string, errs formErrors) policyFormView {
	in := func(name, label, kind, hint string) policyInput {
		return policyInput{Name: name, Label: label, Kind: kind, Hint: hint, Value: v[name], Error: errs[name]}
	}
	sel := func(name, label, hint string, opts []option) policyInput {
		i := in(name, label, "select", hint)
		i.Options = opts
		return i
	}
	policy := policyGroup{ID: "policy", Legend: "Policy"}
	if create {
		policy.Inputs = append(policy.Inputs, in("name", "Name", "text",
			"1 to 63 lowercase letters, digits and inner hyphens; it names the policy in headers, problems and usage, and cannot change later."))
	}
	policy.Inputs = append(policy.Inputs, sel("algorithm", "Algorithm", "The fields below follow the algorithm.", algorithmOptions))
	numbers := policyGroup{ID: "numbers", Legend: "Limits"}
	for _, nf := range policyNumberFields {
		i := in(nf.name, nf.label, "number", nf.hint)
		i.Step = "1"
		if nf.rate {
			i.Step = "any"
		}
		algs := make([]string, len(nf.algorithms))
		for j, a := range nf.algorithms {
			algs[j] = string(a)
		}
		i.When = "algorithm=" + strings.Join(algs, ",")
		i.Hint += " Used by " + strings.Join(algs, ", ") + "."
		numbers.Inputs = append(numbers.Inputs, i)
	}
	match := policyGroup{ID: "match", Legend: "Requests it applies to", Error: errs["match"], Inputs: []policyInput{
		in("match_meters", "Meters", "text", "Comma-separated, such as report, search; empty for every meter."),
		in("match_path_prefix", "Path prefix", "text", "Such as /api/reports; empty for every path."),
		in("match_methods", "Methods", "text", "Comma-separated HTTP methods, such as GET, POST; empty for every method."),
		in("match_tiers", "Tiers", "text", "Comma-separated tier slugs, such as free, pro; empty for every tier."),
	}}
	param := in("param", "Parameter", "text", `header:<name>, query:<name> or path:<segment index> (0-based).`)
	param.When = "scope=param"
	exceptions := in("exceptions", "Exceptions", "textarea",
		"One value=limit a line: other limits (limit, capacity or burst) for hot values.")
	exceptions.When = "scope=param"
	scope := policyGroup{ID: "scope", Legend: "Scope and cost", Inputs: []policyInput{
		sel("scope", "Scope", "Whose requests share one count. adaptive takes node only.", scopeOptions),
		param, exceptions,
		sel("cost", "Cost", "concurrency and adaptive count requests.", costOptions),
	}}
	wait := in("max_wait_ms", "Max wait (ms)", "number", "How long a queued request waits at most, 1 to 60,000.")
	wait.Step, wait.When = "1", "on_refuse=queue"
	refuse := policyGroup{ID: "refuse", Legend: "When it refuses", Inputs: []policyInput{
		sel("on_refuse", "On refuse", "What a refused request gets; shadow and degrade are counted in usage.", onRefuseOptions), wait,
	}}
	status := in("fallback_status", "Status", "number", "200 to 599.")
	status.Step = "1"
	fallback := policyGroup{ID: "fallback", Legend: "Fallback answer", Error: errs["fallback"], When: "on_refuse=degrade",
		Inputs: []policyInput{status,
			in("fallback_content_type", "Content type", "text", "Such as application/json."),
			in("fallback_body", "Body", "textarea", fmt.Sprintf("At most %s bytes.", formatNum(quota.MaxFallbackBody))),
		}}
	return policyFormView{Create: create, Name: name, Errors: errs, Groups: []policyGroup{policy, numbers, match, scope, refuse, fallback}}
}

// policyRow is one policy of the list, its settings in words.
type policyRow struct {
	quota.Policy
	Numbers, Scope, Match, Refuse string
}

func newPolicyRow(p quota.Policy) policyRow {
	return policyRow{Policy: p, Numbers: policyNumbers(p), Scope: policyScope(p), Match: policyMatch(p.Match), Refuse: policyRefuse(p)}
}

// policyNumbers writes a policy's main numbers: "100 per 60 s".
func policyNumbers(p quota.Policy) string {
	n := func(v *int64) string {
		if v == nil {
			return "?"
		}
		return formatNum(*v)
	}
	r := func(v *float64) string {
		if v == nil {
			return "?"
		}
		return strconv.FormatFloat(*v, 'f', -1, 64)
	}
	switch p.Algorithm {
	case quota.AlgFixedWindow, quota.AlgSlidingLog:
		return n(p.Limit) + " per " + n(p.WindowSeconds) + " s"
	case quota.AlgSlidingWindow:
		return n(p.Limit) + " per " + n(p.WindowSeconds) + " s, " + n(p.Buckets) + " buckets"
	case quota.AlgTokenBucket:
		return "capacity " + n(p.Capacity) + ", refills " + r(p.RefillPerSec) + "/s"
	case quota.AlgGCRA, quota.AlgLeakyBucket:
		return r(p.Rate) + "/s, burst " + n(p.Burst)
	case quota.AlgConcurrency:
		return n(p.Limit) + " in flight, lease " + n(p.LeaseSeconds) + " s"
	case quota.AlgWarmUp:
		return r(p.Rate) + "/s, warm-up " + n(p.WarmupSeconds) + " s, cold ×" + n(p.ColdFactor)
	case quota.AlgAdaptive:
		return "at most " + n(p.MaxConcurrency) + " in flight, target " + n(p.TargetLatencyMS) + " ms"
	}
	return ""
}

func policyScope(p quota.Policy) string {
	s := string(p.Scope)
	if p.Scope == quota.ScopeParam {
		s += " " + p.Param
		if len(p.Exceptions) == 1 {
			s += " (1 exception)"
		} else if len(p.Exceptions) > 1 {
			s += fmt.Sprintf(" (%d exceptions)", len(p.Exceptions))
		}
	}
	return s
}

func policyMatch(m quota.PolicyMatch) string {
	var parts []string
	if len(m.Meters) > 0 {
		parts = append(parts, "meters "+strings.Join(m.Meters, ", "))
	}
	if m.PathPrefix != "" {
		parts = append(parts, "path "+m.PathPrefix+"…")
	}
	if len(m.Methods) > 0 {
		parts = append(parts, "methods "+strings.Join(m.Methods, ", "))
	}
	if len(m.Tiers) > 0 {
		parts = append(parts, "tiers "+strings.Join(m.Tiers, ", "))
	}
	if len(parts) == 0 {
		return "every request"
	}
	return strings.Join(parts, "; ")
}

func policyRefuse(p quota.Policy) string {
	switch {
	case p.OnRefuse == quota.RefuseQueue && p.MaxWaitMS != nil:
		return "queue, at most " + formatNum(*p.MaxWaitMS) + " ms"
	case p.OnRefuse == quota.RefuseDegrade && p.Fallback != nil:
		return fmt.Sprintf("degrade to %d %s", p.Fallback.Status, p.Fallback.ContentType)
	}
	return string(p.OnRefuse)
}

type policiesView struct {
	Rows []policyRow
	Next string // cursor of the next page, "" on the last
}

// ---- the console's handlers

// ConsolePolicies shows the policies, up to 200 from the cursor given.
func (s *Pages) ConsolePolicies(c *fiber.Ctx) error {
	list, next, err := s.store.ListPolicies(c.UserContext(), quota.Page{Limit: 200, Cursor: c.Query("cursor")})
	if err != nil {
		return err
	}
	v := policiesView{Next: strOr(next)}
	for _, p := range list {
		v.Rows = append(v.Rows, newPolicyRow(p))
	}
	return s.render(c, fiber.StatusOK, "policies", s.consoleView(c, "Policies", "policies", v))
}

// ConsoleNewPolicy shows an empty policy editor, with the defaults of a new
// policy.
func (s *Pages) ConsoleNewPolicy(c *fiber.Ctx) error {
	v := map[string]string{"algorithm": string(quota.AlgFixedWindow), "scope": string(quota.ScopeTenant),
		"cost": string(quota.CostRequests), "on_refuse": string(quota.RefuseReject)}
	return s.render(c, fiber.StatusOK, "policy", s.consoleView(c, "New policy", "policies", newPolicyForm(true, "", v, formErrors{})))
}

// ConsolePolicyForm shows the editor of the policy named by :name; an
// unknown policy is a 404.
func (s *Pages) ConsolePolicyForm(c *fiber.Ctx) error {
	p, err := s.store.Policy(c.UserContext(), c.Params("name"))
	if err != nil {
		return err
	}
	return s.render(c, fiber.StatusOK, "policy", s.consoleView(c, "Policy "+p.Name, "policies",
		newPolicyForm(false, p.Name, policyValues(p), formErrors{})))
}

// ConsoleCreatePolicy creates a policy as POST /admin/v1/policies does. A
// bad value is shown beside its field and creates nothing.
func (s *Pages) ConsoleCreatePolicy(c *fiber.Ctx) error {
	f, err := readPolicyForm(c, true)
	if err != nil {
		return err
	}
	errs := formErrors{}
	p := policyFromForm(errs, f)
	status, done, err := createFromForm(c, errs, func(err error) { addPolicyError(errs, err) }, func() (string, error) {
		created, err := s.admin.CreatePolicy(c.UserContext(), consoleActor, p)
		return "/console/policies?ok=policy-created#policy-" + url.PathEscape(created.Name), err
	})
	if done {
		return err
	}
	return s.render(c, status, "policy", s.consoleView(c, "New policy", "policies", newPolicyForm(true, "", f, errs)))
}

// ConsoleSavePolicy saves the editor: every field of the policy is
// replaced by the form's (the name stays), then the policy is validated
// exactly as PATCH /admin/v1/policies/{name} validates it. A bad value is
// shown beside its field and changes nothing.
func (s *Pages) ConsoleSavePolicy(c *fiber.Ctx) error {
	name := c.Params("name")
	f, err := readPolicyForm(c, false)
	if err != nil {
		return err
	}
	errs := formErrors{}
	p := policyFromForm(errs, f)
	if len(errs) == 0 {
		saved, err := s.admin.UpdatePolicy(c.UserContext(), consoleActor, name, func(cur *quota.Policy) error {
			// A body unchanged but for its line breaks (which the
			// textarea sent as CR LF, read as LF) stays as it was.
			if p.Fallback != nil && cur.Fallback != nil && p.Fallback.Body == oneLineBreak(cur.Fallback.Body) {
				p.Fallback.Body = cur.Fallback.Body
			}
			p.Name = cur.Name
			*cur = p
			return nil
		})
		if err == nil {
			return c.Redirect("/console/policies?ok=policy-saved#policy-"+url.PathEscape(saved.Name), fiber.StatusSeeOther)
		}
		if quota.ErrorCode(err) != quota.CodeInvalid {
			return err
		}
		addPolicyError(errs, err)
	}
	return s.render(c, fiber.StatusBadRequest, "policy", s.consoleView(c, "Policy "+name, "policies",
		newPolicyForm(false, name, f, errs)))
}

// ConsoleDeletePolicy deletes a policy as DELETE /admin/v1/policies/{name}.
func (s *Pages) ConsoleDeletePolicy(c *fiber.Ctx) error {
	if _, err := readForm(c, csrfField); err != nil {
		return err
	}
	if err := s.admin.DeletePolicy(c.UserContext(), consoleActor, c.Params("name")); err != nil {
		return err
	}
	return c.Redirect("/console/policies?ok=policy-deleted", fiber.StatusSeeOther)
}

// ---- the dashboard's section

// policyStateRow is one of the tenant's policies on its dashboard.
// PerRequest: the policy has no one state of the tenant's to show (its
// remaining is null in /v1/usage: one count per key, address, value or
// node).
type policyStateRow struct {
	Name       string
	Algorithm  quota.Algorithm
	Limit      int64
	Remaining  int64
	Reset      string // RFC 3339, as /v1/usage says it
	PerRequest bool
}

// policyStates are the dashboard's policies.
type policyStates []policyStateRow

// AnyPerRequest reports whether a policy has no one state to show.
func (ps policyStates) AnyPerRequest() bool {
	return slices.ContainsFunc(ps, func(p policyStateRow) bool { return p.PerRequest })
}

// tenantPolicies are the policies of the tenant's tier with their state,
// read as GET /v1/usage reads them.
func (s *Pages) tenantPolicies(c *fiber.Ctx, p catalog.Principal) (policyStates, error) {
	list, err := s.catalog.Policies(c.UserContext())
	if err != nil {
		return nil, s.unavailable(err)
	}
	states, err := s.reports.Policies(c.UserContext(), p, usage.TierPolicies(list, p.Tier.Slug))
	if err != nil {
		return nil, s.unavailable(err)
	}
	rows := make(policyStates, len(states))
	for i, st := range states {
		rows[i] = policyStateRow{Name: st.Name, Algorithm: st.Algorithm, Limit: st.Limit, PerRequest: st.Remaining == nil}
		if st.Remaining != nil {
			rows[i].Remaining = *st.Remaining
		}
		if st.Reset != nil {
			rows[i].Reset = *st.Reset
		}
	}
	return rows, nil
}
