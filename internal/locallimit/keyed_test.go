package locallimit

import (
	"testing"
	"time"
)

func TestKeyed(t *testing.T) {
	t.Parallel()
	r := Rule{Burst: 3, Interval: time.Second, MaxKeys: 100}
	// op: "take" counts an event of key "a" (or reports it blocked), "wait"
	// only asks.
	type op struct {
		kind    string
		at      time.Duration
		blocked bool
		wait    time.Duration
	}
	for _, tc := range []struct {
		name string
		ops  []op
	}{
		{"an unknown key waits for nothing", []op{{kind: "wait"}}},
		{"a burst, then one an interval", []op{
			{kind: "take"}, {kind: "take"}, {kind: "take"},
			{kind: "wait", blocked: true, wait: time.Second},
			{kind: "take", blocked: true, wait: time.Second},
			{kind: "take", at: 250 * time.Millisecond, blocked: true, wait: 750 * time.Millisecond},
			{kind: "take", at: time.Second},
			{kind: "take", at: time.Second, blocked: true, wait: time.Second},
		}},
		{"a refused event counts nothing", []op{
			{kind: "take"}, {kind: "take"}, {kind: "take"},
			{kind: "take", blocked: true, wait: time.Second},
			{kind: "take", blocked: true, wait: time.Second},
			{kind: "take", at: time.Second},
		}},
		{"drained after burst intervals", []op{
			{kind: "take"}, {kind: "take"}, {kind: "take"},
			{kind: "take", at: 3 * time.Second}, {kind: "take", at: 3 * time.Second}, {kind: "take", at: 3 * time.Second},
			{kind: "wait", at: 3 * time.Second, blocked: true, wait: time.Second},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var k Keyed[string] // the zero table works
			for i, o := range tc.ops {
				var wait time.Duration
				var blocked bool
				if o.kind == "take" {
					wait, blocked = k.Take(r, "a", t0.Add(o.at))
				} else {
					wait, blocked = k.Wait(r, "a", t0.Add(o.at))
				}
				if blocked != o.blocked || (blocked && wait != o.wait) {
					t.Fatalf("op %d (%s at +%s): got %s, %t, want %s, %t", i, o.kind, o.at, wait, blocked, o.wait, o.blocked)
				}
			}
			if _, blocked := k.Wait(r, "b", t0); blocked {
				t.Error("another key is blocked")
			}
		})
	}
}

// TestKeyedBound: past MaxKeys a new key drops the drained keys and keeps
// the others; a spray of live keys starts the table afresh.
func TestKeyedBound(t *testing.T) {
	t.Parallel()
	r := Rule{Burst: 2, Interval: time.Second, MaxKeys: 1000}
	k := Keyed[int]{}
	for i := range r.MaxKeys - 1 {
		k.Take(r, i, t0)
	}
	k.Take(r, -1, t0)
	k.Take(r, -1, t0) // key -1 used its burst
	now := t0.Add(r.Interval)
	k.Take(r, -2, now) // the bound: every single event has drained
	if got := len(k); got != 2 {
		t.Fatalf("got %d keys kept, want 2 (the blocked key and the new one)", got)
	}
	if _, kept := k[-1]; !kept {
		t.Error("the blocked key was forgotten")
	}

	for i := range 2 * r.MaxKeys {
		k.Take(r, i, now)
		if len(k) > r.MaxKeys {
			t.Fatalf("after %d keys: got %d held, want at most %d", i+1, len(k), r.MaxKeys)
		}
	}
}
