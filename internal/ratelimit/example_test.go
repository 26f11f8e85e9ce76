package ratelimit_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/ratelimit"
	"github.com/tollgate/tollgate/internal/redisdb"
	"github.com/tollgate/tollgate/internal/redisfn"
	"github.com/tollgate/tollgate/internal/testenv"
)

// exampleRunnerAdmitOutput is what ExampleRunner_Admit prints.
const exampleRunnerAdmitOutput = `allowed: true
burst: 19 of 20 left, window 4s
daily: 990 of 1000 left, window 24h0m0s
`

// A fresh tenant with a burst limit and a daily quota: the first call is
// allowed, and the decision says what is left of each limit. With the Redis
// of REDIS_URL (else 127.0.0.1:6379) it prints:
//
//	allowed: true
//	burst: 19 of 20 left, window 4s
//	daily: 990 of 1000 left, window 24h0m0s
//
// (An example cannot be skipped, and this one needs a Redis: rather than
// by an Output comment, what it prints is checked by TestExampleRunnerAdmit,
// which go test -short skips.)
func ExampleRunner_Admit() {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opts, err := redisdb.ParseURL(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	c, err := redisdb.Open(ctx, opts)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	prefix := "example-" + testenv.RandomHex(4)
	defer testenv.DeleteKeys(c, prefix+"*")

	r := ratelimit.New(redisfn.New(c, prefix))
	d, err := r.Admit(ctx, quota.Request{
		TenantID: "acme",
		Meter:    "report",
		Cost:     10,
		Limits: quota.Limits{
			BurstRate:  quota.Ptr(5.0), // requests per second
			Burst:      quota.Ptr(int64(20)),
			DailyQuota: quota.Ptr(int64(1000)), // cost units per UTC day
		},
		Overage: quota.OverageBlock,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("allowed:", d.Allowed)
	for _, l := range d.Limits {
		fmt.Printf("%s: %d of %d left, window %v\n", l.Name, l.Remaining, l.Limit, l.Window)
	}
}

// TestExampleRunnerAdmit runs ExampleRunner_Admit against the tests' Redis
// and checks what it prints, as an Output comment would.
func TestExampleRunnerAdmit(t *testing.T) {
	t.Setenv("REDIS_URL", testenv.RedisURL(t))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		read <- string(b)
	}()
	stdout := os.Stdout
	os.Stdout = w
	func() {
		defer func() { os.Stdout = stdout }()
		ExampleRunner_Admit()
	}()
	_ = w.Close()
	if got := <-read; got != exampleRunnerAdmitOutput {
		t.Errorf("ExampleRunner_Admit printed:\n%s\nwant:\n%s", got, exampleRunnerAdmitOutput)
	}
}
