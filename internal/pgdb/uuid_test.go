package pgdb_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tollgate/tollgate/internal/pgdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// Ids bound as strings to uuid and uuid[] are encoded in the binary
// format, without the failed attempt pgx's own codec makes; what is not a
// canonical uuid still goes to Postgres as text, which parses or refuses it
// as before.
func TestUUIDStringsEncodeBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgdb.Open(ctx, testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()

	ids := []string{"0b7c6f7e-0a47-4c1e-9d8e-3f1a2b3c4d5e", "FFFFFFFF-0000-4000-8000-ABCDEFABCDEF"}
	m := conn.Conn().TypeMap()
	buf, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, nil)
	if err != nil {
		t.Fatalf("binary encoding of []string to uuid[]: %v", err)
	}
	if len(buf) == 0 {
		t.Fatal("binary encoding of []string to uuid[]: empty")
	}
	if _, err := m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, "not-a-uuid", nil); err == nil {
		t.Fatal("binary encoding of a string that is no uuid: no error, want one (so that pgx sends it as text)")
	}

	var got []string
	if err := conn.QueryRow(ctx, `SELECT array_agg(x::text ORDER BY o) FROM unnest($1::uuid[]) WITH ORDINALITY AS u(x, o)`, ids).Scan(&got); err != nil {
		t.Fatal(err)
	}
	want := []string{"0b7c6f7e-0a47-4c1e-9d8e-3f1a2b3c4d5e", "ffffffff-0000-4000-8000-abcdefabcdef"}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("round trip = %v, want %v", got, want)
	}
	// Forms Postgres accepts that are not canonical: sent as text.
	var one string
	if err := conn.QueryRow(ctx, `SELECT $1::uuid::text`, "{0b7c6f7e0a474c1e9d8e3f1a2b3c4d5e}").Scan(&one); err != nil || one != want[0] {
		t.Fatalf("braced uuid = %q, %v; want %q", one, err, want[0])
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT cardinality($1::uuid[])`, []string{want[0], "0b7c6f7e0a474c1e9d8e3f1a2b3c4d5e"}).Scan(&n); err != nil || n != 2 {
		t.Fatalf("mixed forms: %d, %v; want 2", n, err)
	}
	// And what is no uuid is refused by Postgres, as before.
	var pgErr *pgconn.PgError
	err = conn.QueryRow(ctx, `SELECT cardinality($1::uuid[])`, []string{want[0], "zz"}).Scan(&n)
	if !errors.As(err, &pgErr) || pgErr.Code != "22P02" {
		t.Fatalf("an id that is no uuid: %v, want Postgres' 22P02", err)
	}
}
