// Command check meters one unit of work that a backend does itself: it
// asks Tollgate whether the tenant's API key may spend -cost units of
// -meter, does the work, then settles the check to what the work really
// cost (or refunds it when the work failed).
//
//	TOLLGATE_URL=http://127.0.0.1:8080 TOLLGATE_SERVICE_TOKEN=... TOLLGATE_API_KEY=tg_... \
//	  go run ./examples/check -meter tokens -cost 100 -actual 42
//
// It exits 0 when admitted, 2 when refused (printing the status and the
// problem a client would get), 1 on an error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

func main() {
	meter := flag.String("meter", "requests", "the meter the work counts against")
	cost := flag.Int64("cost", 1, "the units to reserve before the work")
	actual := flag.Int64("actual", -1, "the units the work really cost (settled after it); -1 keeps -cost")
	fail := flag.Bool("fail", false, "pretend the work failed: refund the check")
	flag.Parse()
	code, err := run(context.Background(), *meter, *cost, *actual, *fail)
	if err != nil {
		fmt.Fprintln(os.Stderr, "check:", err)
	}
	os.Exit(code)
}

func run(ctx context.Context, meter string, cost, actual int64, fail bool) (int, error) {
	base, token, key := os.Getenv("TOLLGATE_URL"), os.Getenv("TOLLGATE_SERVICE_TOKEN"), os.Getenv("TOLLGATE_API_KEY")
	if base == "" || token == "" || key == "" {
		return 1, errors.New("set TOLLGATE_URL, TOLLGATE_SERVICE_TOKEN and TOLLGATE_API_KEY")
	}
	c := tollgate.NewServiceClient(base, token, tollgate.WithTimeout(3*time.Second))
	res, err := c.Check(ctx, tollgate.CheckRequest{APIKey: key, Meter: meter, Cost: cost, Path: "/examples/check"})
	if err != nil {
		if p := tollgate.AsProblem(err); p != nil && !tollgate.IsOutage(err) {
			return 1, fmt.Errorf("the Tollgate api refused the check itself: %d %s: %s", p.Status, p.Title, p.Detail)
		}
		return 1, err // an outage: whether to go on is the backend's call
	}
	if !res.Allowed {
		fmt.Printf("refused %d, retry after %s\n%s\n", res.Status, res.Headers["Retry-After"], res.RefusalBody())
		return 2, nil
	}
	fmt.Printf("admitted %s/%s cost %d, request %s\n", meter, res.TenantID, cost, res.RequestID)

	// ... the work ...

	if fail {
		r, err := c.Refund(ctx, res.TenantID, res.RequestID)
		if err != nil {
			return 1, err
		}
		fmt.Printf("refunded %d units\n", -r.Delta)
		return 0, nil
	}
	if actual >= 0 {
		s, err := c.Settle(ctx, res.TenantID, res.RequestID, actual)
		if err != nil {
			return 1, err
		}
		fmt.Printf("settled to %d units (delta %d)\n", s.ActualCost, s.Delta)
	}
	return 0, nil
}
