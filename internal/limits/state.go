package limits

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// State is what Redis holds of one tenant, field by field: the tenant's
// hash <prefix>:v2:{t:<id>} (lua/state.lua), the meter quotas' hash
// <prefix>:v1:{t:<id>}:mq (lua/meterq.lua) and the idempotency records
// <prefix>:v1:{t:<id>}:idem2:<hash> (lua/admit.lua). Parse reads those
// fields into a State and Format writes them back, so that a test compares
// the two stores exactly. Times are µs since the Unix epoch, UTC; days and
// months are ids (days since the epoch, year*100+month) of the tenant's
// calendar.
//
// The zero State is a tenant Redis holds nothing of. A State is not safe
// for concurrent use.
type State struct {
	Counters
	Grants     map[string]int64 // grant id -> units (fields g:<id>)
	ResetStamp int64            // the last quota reset applied (field rs)
	// Usage is the pending "units,requests" of an hour and meter, by field
	// name p<hours since the epoch>|<meter>|; Counts the other pending
	// counters, by field name p<hour start, Unix s>|<meter>|<kind> (kinds
	// u, o, m, x, d, s, r).
	Usage  map[string][2]int64
	Counts map[string]int64

	Meters       map[string]MeterCount // the meter quotas' hash: <meter>
	MetersBefore map[string]MeterMonth // <meter>|w
	Spent        Spend                 // '$': the meters' overage millicents of a month (the spend cap's)
	SpentBefore  Spend                 // '$w'
	Draws        Draws                 // 'P': a prepaid tenant's credit draws

	Idem map[string]IdemRecord // by the key's hash (hex SHA-256)
}

// Counters are the tenant hash's fields t, q, c, w and L: what an
// admission reads and, all at once, writes.
type Counters struct {
	// Exists is true once the tenant's hash holds the limit state (the
	// fields t, q, c); Day and Month are -1 until then.
	Exists    bool
	TAT, Full int64 // GCRA's theoretical arrival time, the bucket's time full again (0: none)
	// the day's and the month's counters (field q)
	Day, DayUsed, DayGrant                  int64
	Month, MonthUsed, MonthGrant, MonthOver int64
	Marks                                   int64 // grant marks counted in q (gn)
	Expiry                                  int64 // the hash's expiry as the state knows it (field c: x)
	MonthEnd                                int64 // the next month's start, cached; 0 with a calendar (field c: mn)
	Before                                  MonthCount
	// Under names the burst limits TAT and Full were written under, "T,B,U,C"
	// (field L): see Decide.
	Under string
}

// MonthCount is a tenant's month kept beside the current one once the next
// began (field w), for refunds and settlements of its requests. Month 0:
// none.
type MonthCount struct{ Month, Used, Grant, Over int64 }

// MeterCount is a meter quota's day and month (field <meter>).
type MeterCount struct{ Day, DayUsed, Month, Used, Over int64 }

// MeterMonth is a meter's month kept once the next began (<meter>|w).
type MeterMonth struct{ Month, Used, Over int64 }

// Spend is the millicents of the meters' overage of a month. Month 0: none.
type Spend struct{ Month, Millicents int64 }

// Draws are what a prepaid tenant's admissions drew on its credit in a
// period and in the one before it (millicents). Month 0: none.
type Draws struct{ Month, Millicents, PrevMonth, PrevMillicents int64 }

// IdemRecord is an idempotency record: the first request's fingerprint,
// whether its answer is stored, its decision (Decision.Flat, the first
// 22 values), its lease's end and its time (µs).
type IdemRecord struct {
	Fingerprint string
	Done        bool
	Decision    []int64
	Lease, At   int64
}

// view is s's counters as the scripts read them: Day and Month -1 for a
// state Redis does not hold.
func (s *State) view() Counters {
	if !s.Exists {
		return Counters{Day: -1, Month: -1, Before: s.Before, Under: s.Under}
	}
	return s.Counters
}

// Format returns the fields of s: the tenant's hash, the meter quotas'
// hash, and each idempotency record's hash, as the scripts write them.
func (s *State) Format() (tenant, meters map[string]string, idem map[string]map[string]string) {
	tenant, meters, idem = map[string]string{}, map[string]string{}, map[string]map[string]string{}
	if s.Exists {
		day0 := s.Day * dayUS
		tenant["t"] = relTime(s.TAT, day0) + "," + relTime(s.Full, day0)
		tenant["q"] = ints(s.Day, s.DayUsed, s.DayGrant, s.Month, s.MonthUsed, s.MonthGrant, s.MonthOver, s.Marks)
		tenant["c"] = ints(ceilDiv(s.Expiry, hourUS), floorDiv(s.MonthEnd, dayUS))
	}
	if s.Before.Month != 0 {
		tenant["w"] = ints(s.Before.Month, s.Before.Used, s.Before.Grant, s.Before.Over)
	}
	if s.Under != "" {
		tenant["L"] = s.Under
	}
	if s.ResetStamp != 0 {
		tenant["rs"] = ints(s.ResetStamp)
	}
	for id, n := range s.Grants {
		tenant["g:"+id] = ints(n)
	}
	for f, u := range s.Usage {
		tenant[f] = ints(u[0], u[1])
	}
	for f, n := range s.Counts {
		tenant[f] = ints(n)
	}
	for m, c := range s.Meters {
		meters[m] = ints(c.Day, c.DayUsed, c.Month, c.Used, c.Over)
	}
	for m, c := range s.MetersBefore {
		meters[m+"|w"] = ints(c.Month, c.Used, c.Over)
	}
	if s.Spent.Month != 0 {
		meters["$"] = ints(s.Spent.Month, s.Spent.Millicents)
	}
	if s.SpentBefore.Month != 0 {
		meters["$w"] = ints(s.SpentBefore.Month, s.SpentBefore.Millicents)
	}
	if d := s.Draws; d.Month != 0 {
		meters["P"] = ints(d.Month, d.Millicents, d.PrevMonth, d.PrevMillicents)
	}
	for k, r := range s.Idem {
		st := "run"
		if r.Done {
			st = "done"
		}
		idem[k] = map[string]string{"fp": r.Fingerprint, "st": st, "dec": ints(r.Decision...),
			"lease": ints(r.Lease), "at": ints(r.At)}
	}
	return tenant, meters, idem
}

// String renders s canonically: its fields, as Format writes them,
// sorted.
func (s *State) String() string {
	tenant, meters, idem := s.Format()
	var b strings.Builder
	for _, h := range []map[string]string{tenant, meters} {
		for _, k := range slices.Sorted(maps.Keys(h)) {
			fmt.Fprintf(&b, "%s=%s ", k, h[k])
		}
		b.WriteString("| ")
	}
	for _, k := range slices.Sorted(maps.Keys(idem)) {
		fmt.Fprintf(&b, "%s:%s,%s,%s,%s,%s ", k, idem[k]["fp"], idem[k]["st"], idem[k]["dec"], idem[k]["lease"], idem[k]["at"])
	}
	return b.String()
}

// StoreAnswer marks the idempotency record of key (its hash) answered,
// as lua/idem.lua's store does: only the record of the same request
// (fingerprint fp) still in flight; it reports whether it did.
func (s *State) StoreAnswer(key, fp string) bool {
	r, ok := s.Idem[key]
	if !ok || r.Fingerprint != fp || r.Done {
		return false
	}
	r.Done = true
	s.Idem[key] = r
	return true
}

// Parse reads a State from the fields Format writes. Fields of an
// idempotency record beyond the decision's (the stored answer) are
// ignored; any other field, or a malformed value, is an error.
func Parse(tenant, meters map[string]string, idem map[string]map[string]string) (State, error) {
	var s State
	var x, mn int64
	if t, ok := tenant["t"]; ok {
		s.Exists = true
		tat, full, _ := strings.Cut(t, ",")
		err := errors.Join(scan(tenant["q"], &s.Day, &s.DayUsed, &s.DayGrant, &s.Month, &s.MonthUsed, &s.MonthGrant,
			&s.MonthOver, &s.Marks), scan(tenant["c"], &x, &mn), absTime(tat, &s.TAT, s.Day), absTime(full, &s.Full, s.Day))
		if err != nil || !strings.Contains(t, ",") {
			return s, fmt.Errorf("limits: parse t, q, c %q %q %q", t, tenant["q"], tenant["c"])
		}
		s.Expiry, s.MonthEnd = x*hourUS, mn*dayUS
	}
	for f, v := range tenant {
		var err error
		switch {
		case f == "t" || f == "q" || f == "c":
		case f == "w":
			err = scan(v, &s.Before.Month, &s.Before.Used, &s.Before.Grant, &s.Before.Over)
		case f == "L":
			s.Under = v
		case f == "rs":
			err = scan(v, &s.ResetStamp)
		case strings.HasPrefix(f, "g:"):
			err = scanInto(&s.Grants, f[2:], v)
		case strings.HasPrefix(f, "p") && strings.HasSuffix(f, "|"):
			var u [2]int64
			err = scan(v, &u[0], &u[1])
			s.Usage = put(s.Usage, f, u)
		case strings.HasPrefix(f, "p"):
			err = scanInto(&s.Counts, f, v)
		default:
			err = errors.New("unknown field")
		}
		if err != nil {
			return s, fmt.Errorf("limits: parse tenant field %q = %q: %w", f, v, err)
		}
	}
	for f, v := range meters {
		var err error
		switch m, before := strings.CutSuffix(f, "|w"); {
		case f == "$":
			err = scan(v, &s.Spent.Month, &s.Spent.Millicents)
		case f == "$w":
			err = scan(v, &s.SpentBefore.Month, &s.SpentBefore.Millicents)
		case f == "P":
			err = scan(v, &s.Draws.Month, &s.Draws.Millicents, &s.Draws.PrevMonth, &s.Draws.PrevMillicents)
		case before:
			var c MeterMonth
			err = scan(v, &c.Month, &c.Used, &c.Over)
			s.MetersBefore = put(s.MetersBefore, m, c)
		default:
			var c MeterCount
			err = scan(v, &c.Day, &c.DayUsed, &c.Month, &c.Used, &c.Over)
			s.Meters = put(s.Meters, f, c)
		}
		if err != nil {
			return s, fmt.Errorf("limits: parse meters field %q = %q: %w", f, v, err)
		}
	}
	for k, h := range idem {
		r := IdemRecord{Fingerprint: h["fp"], Done: h["st"] == "done"}
		dec, err := parseInts(h["dec"], -1)
		if err = errors.Join(err, scan(h["lease"], &r.Lease), scan(h["at"], &r.At)); err != nil || !r.Done && h["st"] != "run" {
			return s, fmt.Errorf("limits: parse idempotency record %s %v: %v", k, h, err) //nolint:errorlint // err is nil for a record in no known state, which %w would print as %!w(<nil>)
		}
		r.Decision = dec
		s.Idem = put(s.Idem, k, r)
	}
	return s, nil
}

// scan reads the comma-separated integers of v into dst, as many as dst.
func scan(v string, dst ...*int64) error {
	n, err := parseInts(v, len(dst))
	for i := 0; err == nil && i < len(dst); i++ {
		*dst[i] = n[i]
	}
	return err
}

// scanInto reads the integer v into m[k].
func scanInto(m *map[string]int64, k, v string) error {
	var n int64
	err := scan(v, &n)
	*m = put(*m, k, n)
	return err
}

// put sets m[k] = v, making m when it is nil.
func put[V any](m map[string]V, k string, v V) map[string]V {
	if m == nil {
		m = map[string]V{}
	}
	m[k] = v
	return m
}

// add adds n to m[k], making m when it is nil (a HINCRBY).
func add(m *map[string]int64, k string, n int64) {
	*m = put(*m, k, (*m)[k]+n)
}

// ints joins integers with commas, as the scripts write them.
func ints(v ...int64) string {
	b := make([]byte, 0, 12*len(v))
	for i, n := range v {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, n, 10)
	}
	return string(b)
}

// parseInts reads n comma-separated integers (any number for n < 0).
func parseInts(s string, n int) ([]int64, error) {
	parts := strings.Split(s, ",")
	if n >= 0 && len(parts) != n {
		return nil, fmt.Errorf("%d values, want %d", len(parts), n)
	}
	out := make([]int64, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// relTime and absTime write and read a time of field t: from the start of
// the state's day, empty for 0 (none).
func relTime(t, day0 int64) string {
	if t == 0 {
		return ""
	}
	return strconv.FormatInt(t-day0, 10)
}

func absTime(s string, t *int64, day int64) error {
	if s == "" {
		return nil
	}
	err := scan(s, t)
	*t += day * dayUS
	return err
}
