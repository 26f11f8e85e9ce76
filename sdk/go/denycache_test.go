package tollgate

import (
	"testing"
	"time"
)

func TestDenyCacheIsBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := newDenyCache(2)
	put := func(key string, secs int) {
		c.put(denyKey{key, "m"}, &denial{until: now.Add(time.Duration(secs) * time.Second), cost: 1, status: 429}, now)
	}
	put("a", 30)
	put("b", 10)
	put("c", 20) // full: b, which ends soonest, goes
	if c.len() != 2 {
		t.Fatalf("len %d, want 2", c.len())
	}
	for key, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if got := c.get(denyKey{key, "m"}, 1, now) != nil; got != want {
			t.Errorf("%s held: %v, want %v", key, got, want)
		}
	}
	// An expired entry gives way before a live one.
	now = now.Add(25 * time.Second) // c has expired, a has 5 s left
	put("d", 60)
	if c.get(denyKey{"a", "m"}, 1, now) == nil || c.get(denyKey{"d", "m"}, 1, now) == nil || c.len() != 2 {
		t.Fatalf("after the expired c made room: a %v d %v len %d, want both held, len 2",
			c.get(denyKey{"a", "m"}, 1, now) != nil, c.get(denyKey{"d", "m"}, 1, now) != nil, c.len())
	}
	if c.get(denyKey{"a", "m"}, 1, now.Add(5*time.Second)) != nil {
		t.Error("a is held past its Retry-After")
	}
	if c.len() != 1 {
		t.Errorf("len %d after a's expiry was seen, want 1", c.len())
	}
}

func TestDenyCacheRefusesOnlyAsMuch(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := newDenyCache(8)
	c.put(denyKey{"k", "m"}, &denial{until: now.Add(time.Minute), cost: 5}, now)
	for _, tc := range []struct {
		key, meter string
		cost       int64
		held       bool
	}{
		{"k", "m", 5, true},
		{"k", "m", 6, true},
		{"k", "m", 4, false}, // a smaller cost may still fit
		{"k", "other", 5, false},
		{"other", "m", 5, false},
	} {
		if got := c.get(denyKey{tc.key, tc.meter}, tc.cost, now) != nil; got != tc.held {
			t.Errorf("%s/%s cost %d: held %v, want %v", tc.key, tc.meter, tc.cost, got, tc.held)
		}
	}
}

func TestAPIKeyOf(t *testing.T) {
	for _, tc := range []struct{ auth, x, want string }{
		{"Bearer tg_1", "", "tg_1"},
		{"bearer tg_1", "tg_2", "tg_1"},
		{"", "tg_2", "tg_2"},
		{"Basic dXNlcjpwdw==", "tg_2", "tg_2"},
		{"Bearer ", "", ""},
		{"", "", ""},
	} {
		if got := APIKeyOf(tc.auth, tc.x); got != tc.want {
			t.Errorf("APIKeyOf(%q, %q) = %q, want %q", tc.auth, tc.x, got, tc.want)
		}
	}
}
