package locallimit_test

import (
	"fmt"
	"time"

	"github.com/tollgate/tollgate/internal/locallimit"
	"github.com/tollgate/tollgate/internal/quota"
)

func ExampleLimiter() {
	l := locallimit.NewLimiter(100_000)
	req := quota.Request{TenantID: "acme", Meter: "search", Cost: 1,
		Limits: quota.Limits{BurstRate: quota.Ptr(1.0), Burst: quota.Ptr(int64(2))}}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for range 3 {
		d, err := l.Admit(req, now)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(d.Allowed, d.RetryAfter)
	}
	req.Cost = 0
	_, err := l.Admit(req, now)
	fmt.Println(err)
	// Output:
	// true 0s
	// true 0s
	// false 1s
	// tollgate invalid: cost: must be an integer between 1 and 1099511627776
}

func ExampleKeyed() {
	rule := locallimit.Rule{Burst: 2, Interval: 3 * time.Second, MaxKeys: 1000}
	var failures locallimit.Keyed[string] // guard it with the owner's lock
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for range 3 {
		fmt.Println(failures.Take(rule, "203.0.113.9", now))
	}
	// Output:
	// 0s false
	// 0s false
	// 3s true
}
