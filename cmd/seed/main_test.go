package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/apikey"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

func TestSeedCreatesDemoTenantAndPrintsAWorkingKey(t *testing.T) {
	t.Parallel()
	url := testenv.NewDatabase(t)
	env := map[string]string{"DATABASE_URL": url, "TOLLGATE_ADMIN_TOKEN": "admin-token-0123456789"}
	keyRE := regexp.MustCompile(`demo API key: (\S+)`)
	var keys []string
	for range 2 {
		var out strings.Builder
		if err := run(context.Background(), func(k string) string { return env[k] }, &out); err != nil {
			t.Fatal(err)
		}
		m := keyRE.FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("output has no demo API key:\n%s", out.String())
		}
		if !strings.Contains(out.String(), "admin-token-0123456789") || !strings.Contains(out.String(), "curl") ||
			!strings.Contains(out.String(), "/dashboard") || !strings.Contains(out.String(), "/console") {
			t.Fatalf("output lacks the admin token, a curl line or the dashboard's addresses:\n%s", out.String())
		}
		keys = append(keys, m[1])
	}
	db, err := pgdb.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var tenants int
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM tenants WHERE name = $1`, demoTenant).Scan(&tenants); err != nil {
		t.Fatal(err)
	}
	if tenants != 1 {
		t.Fatalf("%d demo tenants after two runs, want 1", tenants)
	}
	for _, k := range keys {
		prefix, hash, ok := apikey.Parse(k)
		if !ok {
			t.Fatalf("printed key %q does not parse", k)
		}
		var n int
		if err := db.QueryRow(context.Background(),
			`SELECT count(*) FROM api_keys WHERE prefix = $1 AND secret_sha256 = $2 AND revoked_at IS NULL`, prefix, hash[:]).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("key %s: %d matching rows, want 1", prefix, n)
		}
	}
}
