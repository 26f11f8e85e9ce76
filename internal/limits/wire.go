package limits

import (
	"fmt"
	"strconv"
	"strings"
)

// The wire form of a list: one string, one argument of a script call,
// read in one pass. Entries are separated by ';', an entry's fields by
// ','; the first field is the entry's Kind, numbers are decimal integers:
//
//	r,<T µs>,<burst>                  Rate
//	b,<U µs>,<capacity>               Bucket
//	q,<d|m>,<meter>,<limit>,<price>   Quota: day or month, meter "" for the tier-wide one, price -1 blocks
//	c,<millicents>,<tier price>       Cap
//	p,<tier price>                    Credit
//	x,<spec>                          Policy: the spec as it is (no ';')
//
// A tier with a burst limit, a daily quota and a billed monthly one
// capped at 5 dollars: "r,100000,10;q,d,,1000,-1;q,m,,50000,300;c,500000,300".
// Meter names are quota.ValidMeter's ([a-z0-9_.-]), which holds neither
// separator. The calendar is not in it: its boundaries around now travel
// beside it.

// Wire is the list's wire form.
func (l *List) Wire() string { return l.wire }

func encode(es []Entry) string {
	var b []byte
	for i, e := range es {
		if i > 0 {
			b = append(b, ';')
		}
		b = append(b, byte(e.Kind))
		num := func(v int64) { b = strconv.AppendInt(append(b, ','), v, 10) }
		switch e.Kind {
		case Rate, Bucket:
			num(e.Interval)
			num(e.Size)
		case Quota:
			b = append(b, ",d,"...)
			if e.Monthly {
				b[len(b)-2] = 'm'
			}
			b = append(b, e.Meter...)
			num(e.Limit)
			num(e.Price)
		case Cap:
			num(e.Limit)
			num(e.Price)
		case Credit:
			num(e.Price)
		case Policy:
			b = append(append(b, ','), e.Spec...)
		}
	}
	return string(b)
}

// Decode reads a list's wire form (its calendar is the default one).
func Decode(wire string) (*List, error) {
	l, quotas := &List{wire: wire}, 0
	if wire == "" {
		return l, nil
	}
	for _, s := range strings.Split(wire, ";") {
		f := strings.Split(s, ",")
		if len(f[0]) != 1 {
			return nil, fmt.Errorf("limits: decode %q: entry %q", wire, s)
		}
		e := Entry{Kind: Kind(f[0][0])}
		var n []int64
		var err error
		switch e.Kind {
		case Rate, Bucket:
			if n, err = nums(f, 1, 2); err == nil {
				e.Interval, e.Size = n[0], n[1]
			}
		case Quota:
			if n, err = nums(f, 3, 2); err == nil && (f[1] == "d" || f[1] == "m") {
				e.Monthly, e.Meter, e.Limit, e.Price = f[1] == "m", f[2], n[0], n[1]
			} else if err == nil {
				err = fmt.Errorf("period %q", f[1])
			}
		case Cap:
			if n, err = nums(f, 1, 2); err == nil {
				e.Limit, e.Price = n[0], n[1]
			}
		case Credit:
			if n, err = nums(f, 1, 1); err == nil {
				e.Price = n[0]
			}
		case Policy:
			e.Spec = strings.TrimPrefix(s, "x,")
		default:
			err = fmt.Errorf("kind %q", f[0])
		}
		if err != nil {
			return nil, fmt.Errorf("limits: decode %q: entry %q: %w", wire, s, err)
		}
		l.Entries = append(l.Entries, e)
		if e.Kind == Quota {
			quotas++
		}
	}
	if quotas > 4 {
		// (the tier's and the meter's day and month: a decision holds four)
		return nil, fmt.Errorf("limits: decode %q: %d quotas, at most 4", wire, quotas)
	}
	return l, nil
}

// nums reads the n integers of f from index from, which must be its last.
func nums(f []string, from, n int) ([]int64, error) {
	if len(f) != from+n {
		return nil, fmt.Errorf("%d fields, want %d", len(f), from+n)
	}
	out := make([]int64, n)
	for i := range n {
		v, err := strconv.ParseInt(f[from+i], 10, 64)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
