// Command loadgen measures a running api on loopback: requests per second and
// p50/p99 latency of an unmetered route (/healthz) and a metered route
// (/api/demo/echo), one after the other in the same run, and their ratio.
// It creates its own tenant on a tier whose limits the load cannot reach, so
// every metered request does the full admission. `make bench` runs it.
//
// It only targets loopback addresses, and stops after -duration or -max
// requests per route, whichever comes first.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/config"
	"github.com/tollgate/tollgate/internal/postgres"
	"github.com/tollgate/tollgate/internal/quota"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// Result is one route's measurement.
type Result struct {
	Route    string
	Requests int
	Errors   int
	RPS      float64
	P50, P99 time.Duration
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	base := fs.String("url", "http://127.0.0.1:8080", "the api's base URL (loopback only)")
	duration := fs.Duration("duration", 5*time.Second, "how long each route is driven")
	maxReq := fs.Int("max", 200_000, "most requests per route")
	conc := fs.Int("concurrency", 16, "concurrent clients")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := loopbackOnly(*base); err != nil {
		return err
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		return err
	}
	key, err := benchKey(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConns: *conc, MaxIdleConnsPerHost: *conc, IdleConnTimeout: time.Minute}}
	if err := waitReady(ctx, client, *base); err != nil {
		return err
	}
	unmetered := drive(client, *base+"/healthz", "", *duration, *maxReq, *conc)
	metered := drive(client, *base+"/api/demo/echo", key, *duration, *maxReq, *conc)
	fmt.Fprintf(stdout, "%-16s %10s %8s %12s %10s %10s\n", "route", "requests", "errors", "req/s", "p50", "p99")
	for _, r := range []Result{unmetered, metered} {
		fmt.Fprintf(stdout, "%-16s %10d %8d %12.0f %10s %10s\n", r.Route, r.Requests, r.Errors, r.RPS,
			r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond))
	}
	if unmetered.RPS > 0 {
		fmt.Fprintf(stdout, "metered/unmetered throughput ratio: %.2f (concurrency %d, %s per route)\n",
			metered.RPS/unmetered.RPS, *conc, *duration)
	}
	if metered.Errors > 0 || unmetered.Errors > 0 {
		return errors.New("some requests failed; the figures above are not to be trusted")
	}
	return nil
}

func loopbackOnly(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("-url: %w", err)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("-url: %s is not a loopback address; loadgen only targets this machine", host)
}

// benchKey creates a tenant on a tier of limits the load cannot reach.
func benchKey(ctx context.Context, dbURL string) (string, error) {
	db, err := postgres.Open(ctx, dbURL)
	if err != nil {
		return "", err
	}
	defer db.Close()
	store := postgres.NewStore(db)
	big := quota.Ptr(int64(1) << 40)
	tier := quota.Tier{Slug: "loadgen", Name: "Load generator", Rank: 1_000_000, Overage: quota.OverageBlock,
		Limits: quota.Limits{BurstRate: quota.Ptr(1e6), Burst: quota.Ptr(int64(1e9)), BucketCapacity: quota.Ptr(int64(1e9)),
			BucketRefillPerSec: quota.Ptr(1e6), DailyQuota: big, MonthlyQuota: big}}
	if _, err := store.CreateTier(ctx, "loadgen", tier); err != nil && quota.ErrorCode(err) != quota.CodeConflict {
		return "", err
	}
	t, err := store.CreateTenant(ctx, "loadgen", "loadgen", tier.Slug)
	if err != nil {
		return "", err
	}
	k, err := store.IssueKey(ctx, "loadgen", t.ID, "loadgen")
	return k.Secret, err
}

func waitReady(ctx context.Context, c *http.Client, base string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s/readyz did not answer 200 within 30s", base)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// drive sends GETs from conc clients until d passes or max requests are sent.
func drive(c *http.Client, target, key string, d time.Duration, max, conc int) Result {
	var sent, errs atomic.Int64
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) && sent.Add(1) <= int64(max) {
				req, _ := http.NewRequest("GET", target, nil)
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				t0 := time.Now()
				resp, err := c.Do(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				lat[i] = append(lat[i], time.Since(t0))
				if err != nil || resp.StatusCode != 200 {
					errs.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	r := Result{Route: mustPath(target), Requests: len(all), Errors: int(errs.Load())}
	if len(all) > 0 {
		r.RPS = float64(len(all)) / elapsed.Seconds()
		r.P50 = all[len(all)/2]
		r.P99 = all[len(all)*99/100]
	}
	return r
}

func mustPath(raw string) string {
	u, _ := url.Parse(raw)
	return u.Path
}
