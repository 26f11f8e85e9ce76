// Command seed prepares a local install for `make run`: it applies the
// migrations, ensures a demo tenant exists, issues it a fresh API key and
// prints the key, the admin token and a curl line to try.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/tollgate/tollgate/internal/catalogdb"
	"github.com/tollgate/tollgate/internal/config"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/quota"
)

const demoTenant = "Demo tenant"

func main() {
	if err := run(context.Background(), os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "seed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	db, err := pgdb.OpenMigrated(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	store := catalogdb.NewStore(db)

	var tenantID string
	err = db.QueryRow(ctx, `SELECT id FROM tenants WHERE name = $1 ORDER BY created_at LIMIT 1`, demoTenant).Scan(&tenantID)
	if errors.Is(err, pgx.ErrNoRows) {
		var t quota.Tenant
		if t, err = store.CreateTenant(ctx, "seed", demoTenant, "free"); err != nil {
			return err
		}
		tenantID = t.ID
	} else if err != nil {
		return fmt.Errorf("seed: find demo tenant: %w", err)
	}
	key, err := store.IssueKey(ctx, "seed", tenantID, "make run")
	if err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(cfg.Addr)
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	base := "http://" + net.JoinHostPort(host, port)
	admin := cfg.AdminToken
	if admin == "" {
		admin = "(unset: set TOLLGATE_ADMIN_TOKEN to enable the admin routes)"
	}
	fmt.Fprintf(stdout, `
Tollgate is ready on %[1]s
  demo tenant:  %[2]s (tier free)
  demo API key: %[3]s   (shown once; every make run issues a new one)
  admin token:  %[4]s

Try:
  curl -i -H 'Authorization: Bearer %[3]s' %[1]s/api/demo/echo
  curl -s %[1]s/readyz
  open %[1]s/dashboard (sign in with the API key) and %[1]s/console (the admin token)

`, base, tenantID, key.Secret, admin)
	return nil
}
