package config

import (
	"strings"
	"testing"
)

// TestLoadOpsAddr: TOLLGATE_OPS_ADDR is unset by default (operations stay
// on TOLLGATE_ADDR), a host:port when set, and never TOLLGATE_ADDR itself.
func TestLoadOpsAddr(t *testing.T) {
	t.Parallel()
	if c, err := Load(env(nil)); err != nil || c.OpsAddr != "" {
		t.Fatalf("default: OpsAddr %q (%v), want none", c.OpsAddr, err)
	}
	for _, v := range []string{"127.0.0.1:9090", "0.0.0.0:9090", "[::1]:0", ":9090"} {
		if c, err := Load(env(map[string]string{"TOLLGATE_OPS_ADDR": v})); err != nil || c.OpsAddr != v {
			t.Errorf("TOLLGATE_OPS_ADDR=%q: OpsAddr %q (%v), want it", v, c.OpsAddr, err)
		}
	}
	// Two listeners that would each pick a free port are two addresses.
	if _, err := Load(env(map[string]string{"TOLLGATE_ADDR": "127.0.0.1:0", "TOLLGATE_OPS_ADDR": "127.0.0.1:0"})); err != nil {
		t.Errorf("both on port 0: %v, want no error", err)
	}
	for _, m := range []map[string]string{
		{"TOLLGATE_OPS_ADDR": "nonsense"},
		{"TOLLGATE_OPS_ADDR": "127.0.0.1:99999"},
		{"TOLLGATE_OPS_ADDR": "127.0.0.1:http"},
		{"TOLLGATE_OPS_ADDR": "127.0.0.1:8080"}, // TOLLGATE_ADDR's default
		{"TOLLGATE_ADDR": "0.0.0.0:80", "TOLLGATE_OPS_ADDR": "0.0.0.0:80"},
	} {
		_, err := Load(env(m))
		if err == nil || !strings.Contains(err.Error(), "TOLLGATE_OPS_ADDR") {
			t.Errorf("%v: got %v, want an error naming TOLLGATE_OPS_ADDR", m, err)
		}
	}
}
