package api

import (
	"context"
	"testing"

	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/testenv"
)

// TestSessionsAreBoundedPerOwner: a holder of a valid key signs in again
// and again; Redis keeps at most redisdb.MaxPerOwner of its sessions, the
// newest ones: the oldest are ended, the newest still open the dashboard.
// Another tenant's session is not touched.
func TestSessionsAreBoundedPerOwner(t *testing.T) {
	t.Parallel()
	s := mustStack(t)
	_, key := s.tenant("free")
	_, other := s.tenant("free")
	base := s.start()
	bystander := newWebClient(t, base)
	bystander.mustSignIn("dashboard", other)

	const n = redisdb.MaxPerOwner + 8
	clients := make([]*webClient, n)
	for i := range clients {
		clients[i] = newWebClient(t, base)
		clients[i].mustSignIn("dashboard", key)
	}
	rdb := testenv.Redis(t)
	keys, err := rdb.Keys(context.Background(), s.prefix+":v1:session:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := redisdb.MaxPerOwner + 1; len(keys) != want {
		t.Errorf("%d sessions in Redis after %d sign-ins of one tenant and one of another, want %d", len(keys), n, want)
	}
	for i, c := range clients {
		r := c.get("/dashboard")
		live := i >= n-redisdb.MaxPerOwner
		if got := r.status == 200; got != live {
			t.Errorf("session %d of %d: GET /dashboard %d, want live %t", i, n, r.status, live)
		}
	}
	if r := bystander.get("/dashboard"); r.status != 200 {
		t.Errorf("another tenant's session: GET /dashboard %d, want 200", r.status)
	}
}
