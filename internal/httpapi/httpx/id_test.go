package httpx

import (
	"encoding/hex"
	"testing"
)

// TestNewIDIsRandom: ids are 128 bits in 32 hex digits, all different,
// sharing no prefix a guesser could learn from one of them.
func TestNewIDIsRandom(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	prefixes := map[string]int{}
	for range 10000 {
		id := NewID()
		if b, err := hex.DecodeString(id); err != nil || len(b) != 16 || len(id) != 32 {
			t.Fatalf("id %q: want 32 hex digits (128 bits)", id)
		}
		if seen[id] {
			t.Fatalf("id %q made twice", id)
		}
		seen[id] = true
		prefixes[id[:4]]++
	}
	for p, n := range prefixes {
		if n > 20 { // 10000 ids over 65536 prefixes: a few each at most
			t.Fatalf("prefix %s in %d of 10000 ids", p, n)
		}
	}
}
