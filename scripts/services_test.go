// Package scripts holds the tests of the repository's shell scripts
// (services.sh); the scripts themselves are run by the Makefile.
package scripts

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/internal/testenv"
)

// fakeRedis answers on a loopback port as a Redis of version v would to
// what scripts/services.sh asks: INFO (as a RESP array or inline) with
// its redis_version, anything else +OK. It returns the server's
// redis:// URL.
func fakeRedis(t *testing.T, v string) string {
	t.Helper()
	return "redis://" + testenv.ServeConns(t, func(c net.Conn) {
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(line, "*"), strings.HasPrefix(line, "$"):
				// a RESP array's header, or one of its strings' lengths
			case strings.EqualFold(strings.Fields(line + " x")[0], "INFO"):
				body := "# Server\r\nredis_version:" + v + "\r\nredis_mode:standalone\r\n"
				fmt.Fprintf(c, "$%d\r\n%s\r\n", len(body), body)
			case strings.EqualFold(strings.TrimSpace(line), "server"):
				// INFO's argument, in an array
			default:
				fmt.Fprint(c, "+OK\r\n")
			}
		}
	}) + "/0"
}

// runServices runs scripts/services.sh with env added to the test's.
func runServices(t *testing.T, env ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command("bash", "services.sh")
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// TestServicesRefusesRedisOlderThan7: Tollgate's Redis code is a Function
// library (Redis 7.0 and later), so services.sh refuses, with a message
// that says so, a REDIS_URL whose server (any of a cluster's addresses) is
// older, and passes a 7.
func TestServicesRefusesRedisOlderThan7(t *testing.T) {
	t.Parallel()
	old, seven, newer := fakeRedis(t, "6.2.14"), fakeRedis(t, "7.0.15"), fakeRedis(t, "7.2.4")
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{old, false},
		{seven, true},
		{newer, true},
		{seven + "," + strings.TrimPrefix(old, "redis://"), false},
	} {
		out, errOut, err := runServices(t, "REDIS_URL="+tc.url, "DATABASE_URL=postgres://postgres@127.0.0.1:1/none")
		if tc.ok {
			if err != nil || !strings.Contains(out, "export REDIS_URL=") {
				t.Errorf("REDIS_URL=%s: %v, stdout %q, stderr %q; want the exports", tc.url, err, out, errOut)
			}
			continue
		}
		if err == nil || out != "" || !strings.Contains(errOut, "version 6.2.14; Tollgate needs Redis 7.0 or later") {
			t.Errorf("REDIS_URL=%s: %v, stdout %q, stderr %q; want a refusal naming 6.2.14 and 7.0", tc.url, err, out, errOut)
		}
	}
}

// TestServicesStripeMock: `services.sh stripe-mock` passes STRIPE_MOCK_URL
// on as it is; without it, it prints the URL of a stripe-mock that answers
// (ours, started and installed when missing).
func TestServicesStripeMock(t *testing.T) {
	testenv.Integration(t, "stripe-mock (installed and started by services.sh when missing)")
	run := func(env ...string) string {
		t.Helper()
		cmd := exec.Command("bash", "services.sh", "stripe-mock")
		cmd.Env = append(os.Environ(), env...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			t.Fatalf("services.sh stripe-mock: %v\n%s", err, e.String())
		}
		return o.String()
	}
	if got, want := run("STRIPE_MOCK_URL=http://127.0.0.1:1"), "export STRIPE_MOCK_URL='http://127.0.0.1:1'\n"; got != want {
		t.Errorf("with STRIPE_MOCK_URL set: stdout %q, want %q", got, want)
	}
	out := run("STRIPE_MOCK_URL=")
	url, ok := strings.CutPrefix(strings.TrimSpace(out), "export STRIPE_MOCK_URL=")
	if !ok || strings.Count(out, "\n") != 1 {
		t.Fatalf("stdout %q, want one export line", out)
	}
	url = strings.Trim(url, "'")
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("STRIPE_MOCK_URL %q, want a loopback URL", url)
	}
	t.Setenv("STRIPE_MOCK_URL", url)
	testenv.StripeMockURL(t) // fails the test unless it answers like stripe-mock
}
