package apikey

import (
	"strings"
	"testing"
)

func TestNewParsesBack(t *testing.T) {
	seen := map[string]bool{}
	for range 200 {
		k, err := New()
		if err != nil {
			t.Fatal(err)
		}
		if len(k.Secret) != Len {
			t.Fatalf("len(%q) = %d, want %d", k.Secret, len(k.Secret), Len)
		}
		prefix, hash, ok := Parse(k.Secret)
		if !ok || prefix != k.Prefix || hash != k.Hash {
			t.Fatalf("Parse(%q) = %q, %x, %t; want %q, %x, true", k.Secret, prefix, hash, ok, k.Prefix, k.Hash)
		}
		if seen[k.Prefix] {
			t.Fatalf("prefix %q repeated", k.Prefix)
		}
		seen[k.Prefix] = true
	}
}

func TestParseRejects(t *testing.T) {
	k, _ := New()
	for _, tc := range []struct{ name, key string }{
		{"empty", ""},
		{"short", k.Secret[:Len-1]},
		{"long", k.Secret + "a"},
		{"wrong scheme", "xx" + k.Secret[2:]},
		{"bad separator", k.Secret[:PrefixLen] + "-" + k.Secret[PrefixLen+1:]},
		{"upper-case id", "tg_" + strings.ToUpper(k.Secret[3:PrefixLen]) + k.Secret[PrefixLen:]},
		{"non-alphanumeric secret", k.Secret[:Len-1] + "!"},
		{"unicode", k.Secret[:Len-2] + "é"},
	} {
		if _, _, ok := Parse(tc.key); ok {
			t.Errorf("%s: Parse(%q) ok, want rejected", tc.name, tc.key)
		}
	}
}

func TestEqual(t *testing.T) {
	a, _ := New()
	b, _ := New()
	if !Equal(a.Hash[:], a.Hash[:]) || Equal(a.Hash[:], b.Hash[:]) {
		t.Fatal("Equal disagrees with byte equality")
	}
}
