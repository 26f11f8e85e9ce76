package limits

import (
	"fmt"
	"maps"
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

// Clone returns a deep copy of s.
func (s *State) Clone() State {
	c := *s
	c.Grants, c.Usage, c.Counts = maps.Clone(s.Grants), maps.Clone(s.Usage), maps.Clone(s.Counts)
	c.Meters, c.MetersBefore, c.Idem = maps.Clone(s.Meters), maps.Clone(s.MetersBefore), maps.Clone(s.Idem)
	return c
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

// Parse reads a State from the fields Format writes. Fields of an
// idempotency record beyond the decision's (the stored answer) are
// ignored; any other field, or a malformed value, is an error.
func Parse(tenant, meters map[string]string, idem map[string]map[string]string) (State, error) {
	var s State
	bad := func(key, field, v string) error {
		return fmt.Errorf("limits: parse %s field %q: %q", key, field, v)
	}
	if t, ok := tenant["t"]; ok {
		q, err1 := parseInts(tenant["q"], 8)
		c, err2 := parseInts(tenant["c"], 2)
		tat, full, found := strings.Cut(t, ",")
		if err1 != nil || err2 != nil || !found {
			return s, bad("tenant", "t/q/c", t+" "+tenant["q"]+" "+tenant["c"])
		}
		s.Exists = true
		s.Day, s.DayUsed, s.DayGrant, s.Month, s.MonthUsed, s.MonthGrant, s.MonthOver, s.Marks =
			q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]
		s.Expiry, s.MonthEnd = c[0]*hourUS, c[1]*dayUS
		var err error
		if s.TAT, err = absTime(tat, s.Day*dayUS); err != nil {
			return s, bad("tenant", "t", t)
		}
		if s.Full, err = absTime(full, s.Day*dayUS); err != nil {
			return s, bad("tenant", "t", t)
		}
	}
	for f, v := range tenant {
		var err error
		switch {
		case f == "t" || f == "q" || f == "c":
			if !s.Exists {
				err = bad("tenant", f, v)
			}
		case f == "w":
			var n []int64
			if n, err = parseInts(v, 4); err == nil {
				s.Before = MonthCount{n[0], n[1], n[2], n[3]}
			}
		case f == "L":
			s.Under = v
		case f == "rs":
			s.ResetStamp, err = strconv.ParseInt(v, 10, 64)
		case strings.HasPrefix(f, "g:"):
			err = setInt(&s.Grants, f[2:], v)
		case strings.HasPrefix(f, "p") && strings.HasSuffix(f, "|"):
			var n []int64
			if n, err = parseInts(v, 2); err == nil {
				s.Usage = put(s.Usage, f, [2]int64{n[0], n[1]})
			}
		case strings.HasPrefix(f, "p"):
			err = setInt(&s.Counts, f, v)
		default:
			err = fmt.Errorf("unknown")
		}
		if err != nil {
			return s, bad("tenant", f, v)
		}
	}
	for f, v := range meters {
		var n []int64
		var err error
		switch {
		case f == "$" || f == "$w":
			if n, err = parseInts(v, 2); err == nil && f == "$" {
				s.Spent = Spend{n[0], n[1]}
			} else if err == nil {
				s.SpentBefore = Spend{n[0], n[1]}
			}
		case f == "P":
			if n, err = parseInts(v, 4); err == nil {
				s.Draws = Draws{n[0], n[1], n[2], n[3]}
			}
		case strings.HasSuffix(f, "|w"):
			if n, err = parseInts(v, 3); err == nil {
				s.MetersBefore = put(s.MetersBefore, strings.TrimSuffix(f, "|w"), MeterMonth{n[0], n[1], n[2]})
			}
		default:
			if n, err = parseInts(v, 5); err == nil {
				s.Meters = put(s.Meters, f, MeterCount{n[0], n[1], n[2], n[3], n[4]})
			}
		}
		if err != nil {
			return s, bad("meters", f, v)
		}
	}
	for k, h := range idem {
		var r IdemRecord
		var err error
		r.Fingerprint, r.Done = h["fp"], h["st"] == "done"
		r.Lease, err = strconv.ParseInt(h["lease"], 10, 64)
		if err == nil {
			r.At, err = strconv.ParseInt(h["at"], 10, 64)
		}
		if err == nil {
			r.Decision, err = parseInts(h["dec"], -1)
		}
		if err != nil || (h["st"] != "run" && h["st"] != "done") {
			return s, bad("idem "+k, "dec/lease/at/st", fmt.Sprint(h))
		}
		s.Idem = put(s.Idem, k, r)
	}
	return s, nil
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

func setInt(m *map[string]int64, k, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil {
		*m = put(*m, k, n)
	}
	return err
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

func absTime(s string, day0 int64) (int64, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v + day0, err
}
