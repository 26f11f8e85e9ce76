package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/httpapi"
	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// readyProblem GETs /readyz of an app with the api's ready checks over rdb
// and a fresh migrated database (after breaking it with sql, when given) and
// returns the 503 problem's checks.
func readyProblem(t *testing.T, rdb redis.UniversalClient, sql string) map[string]any {
	t.Helper()
	ctx := context.Background()
	db, err := pgdb.Open(ctx, testenv.MigratedDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	if sql != "" {
		if _, err := db.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := httpapi.New(httpapi.Deps{Log: log, Sessions: redisdb.NewSessions(rdb, "tg"), Ready: readyChecks(rdb, db)}, httpapi.Options{BodyLimit: 1024})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.App().Test(httptest.NewRequest("GET", "/readyz", nil), 10_000)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p struct {
		Checks map[string]any `json:"checks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || resp.StatusCode != 503 {
		t.Fatalf("GET /readyz: %d (%v), want a 503 problem", resp.StatusCode, err)
	}
	return p.Checks
}

func TestReadyzIs503WhenRedisIsAway(t *testing.T) {
	t.Parallel()
	away := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { away.Close() })
	if checks := readyProblem(t, away, ""); checks["redis"] == "ok" || checks["postgres"] != "ok" || checks["schema"] != "ok" {
		t.Fatalf("checks = %v, want redis failing, postgres and schema ok", checks)
	}
}

func TestReadyzIs503WhenSchemaIsBehind(t *testing.T) {
	t.Parallel()
	if checks := readyProblem(t, testenv.Redis(t), `UPDATE schema_migrations SET version = 0`); checks["schema"] == "ok" || checks["redis"] != "ok" {
		t.Fatalf("checks = %v, want schema failing, redis ok", checks)
	}
}
