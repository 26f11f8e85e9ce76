package quota_test

import (
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
)

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"0f8fad5b-d9cb-469f-a165-70867728950e", true},
		{"0F8FAD5B-D9CB-469F-A165-70867728950E", true},
		{"00000000-0000-0000-0000-000000000000", true},
		{"ffffffff-ffff-ffff-ffff-ffffffffffff", true},
		{"", false},
		{"0f8fad5b-d9cb-469f-a165-70867728950", false},   // 35 bytes
		{"0f8fad5b-d9cb-469f-a165-70867728950e0", false}, // 37 bytes
		{"0f8fad5bd9cb469fa16570867728950e", false},      // no hyphens
		{"{0f8fad5b-d9cb-469f-a165-70867728950e}", false},
		{"0f8fad5b-d9cb-469f-a165-70867728950g", false},
		{"0f8fad5b+d9cb-469f-a165-70867728950e", false},
		{"0f8fad5bd-9cb-469f-a165-70867728950e", false}, // hyphen one place off
		{"0f8fad5b-d9cb-469f-a165-7086772895-e", false}, // a fifth hyphen
		{"0f8fad5b-d9cb-469f-a165-708677289\u00e9e", false},
		{"0f8fad5b-d9cb-469f-a165-70867728950\x00", false},
		{"0f8fad5b-d9cb-469f-a165-70867728950e\n", false},
		{"' OR 1=1 --                         ", false},
	} {
		if got := quota.ValidID(tc.id); got != tc.want {
			t.Errorf("ValidID(%q) = %t, want %t", tc.id, got, tc.want)
		}
	}
}
