package routes

import (
	"strings"
	"testing"
)

// TestSettleField: settle is an upstream route's, and excludes
// refund_on_5xx.
func TestSettleField(t *testing.T) {
	t.Parallel()
	tab, err := Parse([]byte(`{"routes": [{"method": "*", "path": "/api/gen/", "meter": "gen", "cost": 10, "upstream": "http://127.0.0.1:9/", "settle": true}]}`))
	if err != nil || !tab.Match("GET", "/api/gen/x").Settle {
		t.Fatalf("settle route: %v", err)
	}
	for _, bad := range []string{
		`{"routes": [{"method": "GET", "path": "/api/e", "meter": "e", "cost": 1, "handler": "echo", "settle": true}]}`,
		`{"routes": [{"method": "*", "path": "/api/gen/", "meter": "gen", "cost": 1, "upstream": "http://127.0.0.1:9/", "settle": true, "refund_on_5xx": true}]}`,
	} {
		if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "settle") {
			t.Errorf("%s: %v, want an error naming settle", bad, err)
		}
	}
}
