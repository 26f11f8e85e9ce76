package tollgate_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

// runExample runs the built example name with env and args; it returns its
// output and exit code.
func runExample(t *testing.T, name string, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(binaries(t), name), args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return string(out), 0
}

func TestExampleCheck(t *testing.T) {
	s := sharedStack(t)
	tn := s.newTenant(t, 10)
	env := []string{"TOLLGATE_URL=" + s.base, "TOLLGATE_SERVICE_TOKEN=" + serviceToken, "TOLLGATE_API_KEY=" + tn.key}

	out, code := runExample(t, "check", env, "-meter", "tokens", "-cost", "6", "-actual", "2")
	if code != 0 || !regexp.MustCompile(`admitted tokens/`+tn.id+` cost 6, request [0-9a-f]{32}\n`).MatchString(out) ||
		!strings.Contains(out, "settled to 2 units (delta -4)") {
		t.Fatalf("check -cost 6 -actual 2: exit %d\n%s\nwant admitted, then settled to 2", code, out)
	}
	out, code = runExample(t, "check", env, "-meter", "tokens", "-cost", "3", "-fail")
	if code != 0 || !strings.Contains(out, "refunded 3 units") {
		t.Fatalf("check -fail: exit %d\n%s\nwant refunded 3", code, out)
	}
	out, code = runExample(t, "check", env, "-meter", "tokens", "-cost", "9")
	if code != 2 || !strings.HasPrefix(out, "refused 429, retry after ") || !strings.Contains(out, `"violated-policies":["daily"]`) {
		t.Fatalf("check -cost 9 with 8 left: exit %d\n%s\nwant 2, refused 429 with the problem", code, out)
	}
	if got := daily(t, mustCheck(t, s.serviceClient(newCounter()), tn.key, "tokens", 1, true).Limits) + 1; got != 8 {
		t.Fatalf("after the example's checks: %d left, want 8 (2 settled, 3 refunded, 9 refused)", got)
	}
	if out, code = runExample(t, "check", []string{"TOLLGATE_URL=", "TOLLGATE_SERVICE_TOKEN=", "TOLLGATE_API_KEY="}); code != 1 || !strings.Contains(out, "set TOLLGATE_URL") {
		t.Fatalf("without configuration: exit %d %s, want 1 naming the variables", code, out)
	}
}

// TestExampleServers runs the net/http and the Fiber example against the
// real api: admitted with the quota headers, refused 429 problem, a 5xx
// refunded, fail-open once the api is stopped.
func TestExampleServers(t *testing.T) {
	s := sharedStack(t)
	for _, name := range []string{"nethttp", "fiber"} {
		t.Run(name, func(t *testing.T) {
			tn := s.newTenant(t, 2)
			base, stopAPI, err := s.startAPI(binaries(t))
			if err != nil {
				t.Fatal(err)
			}
			defer stopAPI()
			env := append(os.Environ(), "TOLLGATE_URL="+base, "TOLLGATE_SERVICE_TOKEN="+serviceToken, "ADDR=127.0.0.1:0", "FAIL_OPEN=true")
			addr, stop, err := startProcess(filepath.Join(binaries(t), name), env, "listening", "addr")
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			url := "http://" + addr

			hello := get(t, url+"/hello", tn.key)
			if hello.status != 200 || hello.body == nil || !strings.Contains(string(hello.body), "hello, tenant "+tn.id) || hello.header.Get("RateLimit-Policy") == "" {
				t.Fatalf("/hello: %d %q policy %q, want 200 naming the tenant, with the quota headers", hello.status, hello.body, hello.header.Get("RateLimit-Policy"))
			}
			if b := get(t, url+"/broken", tn.key); b.status != 500 {
				t.Fatalf("/broken: %d, want 500", b.status)
			}
			get(t, url+"/hello", tn.key) // the second of 2: the broken one was refunded
			refused := get(t, url+"/hello", tn.key)
			var p tollgate.Problem
			if refused.status != 429 || refused.header.Get("Content-Type") != "application/problem+json" || refused.header.Get("Retry-After") == "" ||
				jsonInto(refused.body, &p) != nil || p.Status != 429 || p.Instance != "/hello" {
				t.Fatalf("third /hello of 2 (one refunded): %d %v %s, want a 429 problem for /hello with Retry-After", refused.status, refused.header, refused.body)
			}

			stopAPI()
			// Still refused from the deny cache; another tenant is served, marked.
			if again := get(t, url+"/hello", tn.key); again.status != 429 {
				t.Fatalf("refused key with the api stopped: %d, want the cached 429", again.status)
			}
			other := s.newTenant(t, 2)
			open := get(t, url+"/hello", other.key)
			if open.status != 200 || open.header.Get("Tollgate-Degraded") != "fail-open" {
				t.Fatalf("with the api stopped: %d degraded %q, want 200 fail-open", open.status, open.header.Get("Tollgate-Degraded"))
			}
		})
	}
}
