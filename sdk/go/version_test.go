package tollgate_test

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

// TestVersion holds Version to semantic versioning and to the newest entry
// of CHANGELOG.md, and checks that it is sent in the User-Agent.
func TestVersion(t *testing.T) {
	if !regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`).MatchString(tollgate.Version) {
		t.Fatalf("Version %q is not a semantic version", tollgate.Version)
	}
	log, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	first := regexp.MustCompile(`(?m)^## v(\S+)`).FindStringSubmatch(string(log))
	if first == nil || first[1] != tollgate.Version {
		t.Fatalf("CHANGELOG.md's newest entry %v, want v%s", first, tollgate.Version)
	}

	s := sharedStack(t)
	tn := s.newTenant(t, 10)
	var mu sync.Mutex
	var agents []string
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		agents = append(agents, r.Header.Get("User-Agent"))
		mu.Unlock()
		return http.DefaultTransport.RoundTrip(r)
	})}
	c := tollgate.NewTenantClient(s.base, tn.key, tollgate.WithHTTPClient(hc), tollgate.WithUserAgent("billing-job/2"))
	if _, err := c.Usage(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(agents) != 1 || agents[0] != "billing-job/2 tollgate-go/"+tollgate.Version {
		t.Fatalf("User-Agent %q, want %q", agents, "billing-job/2 tollgate-go/"+tollgate.Version)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestCredentialThatNoHeaderCarries is the caller's error, said before any
// call, not an outage.
func TestCredentialThatNoHeaderCarries(t *testing.T) {
	_, err := tollgate.NewTenantClient("http://"+closedAddr(t), "tg_a\r\nX-Injected: 1").Usage(context.Background())
	if err == nil || tollgate.IsOutage(err) || !strings.Contains(err.Error(), "header cannot carry") {
		t.Fatalf("usage with a key holding CR LF: %v, want an error naming it, not an outage", err)
	}
}
