package ratelimit

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

const never = -time.Microsecond // RetryAfter of a request that can never pass

// step is one admission (or grant) of a table case and what it must answer.
type step struct {
	at    string // RFC 3339 time of the step
	cost  int64
	dry   bool
	idem  string
	grant string // "day" or "month": grant cost units instead of admitting
	store bool   // store the answer of the request with idem and fp instead of admitting
	fp    string // idempotency fingerprint
	lease time.Duration
	// limits, when set, replace the case's limits from this step on (a tier
	// change).
	limits      *quota.Limits
	idemOutcome quota.IdemOutcome

	allowed   bool
	violated  []quota.LimitName
	retry     time.Duration // checked when !allowed
	overage   int64
	replayed  bool
	remaining map[quota.LimitName]int64  // checked for the limits listed
	limit     map[quota.LimitName]int64  // checked for the limits listed
	reset     map[quota.LimitName]string // checked for the limits listed
	window    map[quota.LimitName]time.Duration
	active    []quota.LimitName // when set, exactly the active limits
}

type tableCase struct {
	name    string
	limits  quota.Limits
	overage quota.Overage
	steps   []step
}

type rem = map[quota.LimitName]int64

const (
	burst   = quota.LimitBurst
	bucket  = quota.LimitBucket
	daily   = quota.LimitDaily
	monthly = quota.LimitMonthly
)

var tableCases = []tableCase{
	{
		name:   "gcra admits the burst then refuses until one interval passed",
		limits: quota.Limits{BurstRate: f64(10), Burst: i64(3)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 5, allowed: true, remaining: rem{burst: 2},
				reset: map[quota.LimitName]string{burst: "2030-06-10T12:00:00.1Z"}, window: map[quota.LimitName]time.Duration{burst: 300 * time.Millisecond}},
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true, remaining: rem{burst: 1}},
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true, remaining: rem{burst: 0},
				reset: map[quota.LimitName]string{burst: "2030-06-10T12:00:00.3Z"}},
			{at: "2030-06-10T12:00:00Z", cost: 1, violated: []quota.LimitName{burst}, retry: 100 * time.Millisecond,
				remaining: rem{burst: 0}, reset: map[quota.LimitName]string{burst: "2030-06-10T12:00:00.3Z"}},
			{at: "2030-06-10T12:00:00.099999Z", cost: 1, violated: []quota.LimitName{burst}, retry: time.Microsecond},
			{at: "2030-06-10T12:00:00.1Z", cost: 1, allowed: true, remaining: rem{burst: 0},
				reset: map[quota.LimitName]string{burst: "2030-06-10T12:00:00.4Z"}},
			{at: "2030-06-10T12:00:02Z", cost: 1, allowed: true, remaining: rem{burst: 2}},
		},
	},
	{
		name:   "gcra uses the whole-microsecond interval",
		limits: quota.Limits{BurstRate: f64(3), Burst: i64(1)}, // T = 333333 us
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true, remaining: rem{burst: 0}},
			{at: "2030-06-10T12:00:00.333332Z", cost: 1, violated: []quota.LimitName{burst}, retry: time.Microsecond},
			{at: "2030-06-10T12:00:00.333333Z", cost: 1, allowed: true, remaining: rem{burst: 0}},
		},
	},
	{
		name:   "bucket counts cost units and refills continuously",
		limits: quota.Limits{BucketCapacity: i64(10), BucketRefillPerSec: f64(2)}, // U = 0.5 s
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 4, allowed: true, remaining: rem{bucket: 6},
				reset: map[quota.LimitName]string{bucket: "2030-06-10T12:00:02Z"}, window: map[quota.LimitName]time.Duration{bucket: 5 * time.Second}},
			{at: "2030-06-10T12:00:00Z", cost: 6, allowed: true, remaining: rem{bucket: 0},
				reset: map[quota.LimitName]string{bucket: "2030-06-10T12:00:05Z"}},
			{at: "2030-06-10T12:00:00Z", cost: 1, violated: []quota.LimitName{bucket}, retry: 500 * time.Millisecond, remaining: rem{bucket: 0}},
			// Two units have dripped back in one second.
			{at: "2030-06-10T12:00:01Z", cost: 3, violated: []quota.LimitName{bucket}, retry: 500 * time.Millisecond, remaining: rem{bucket: 2}},
			{at: "2030-06-10T12:00:01Z", cost: 2, allowed: true, remaining: rem{bucket: 0}},
			{at: "2030-06-10T12:00:01Z", cost: 11, violated: []quota.LimitName{bucket}, retry: never},
			{at: "2030-06-10T12:01:00Z", cost: 10, allowed: true, remaining: rem{bucket: 0}},
		},
	},
	{
		name:   "bucket with a fractional refill rate",
		limits: quota.Limits{BucketCapacity: i64(3), BucketRefillPerSec: f64(0.4)}, // U = 2.5 s
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 3, allowed: true, remaining: rem{bucket: 0}},
			{at: "2030-06-10T12:00:02.4Z", cost: 1, violated: []quota.LimitName{bucket}, retry: 100 * time.Millisecond},
			{at: "2030-06-10T12:00:02.5Z", cost: 1, allowed: true, remaining: rem{bucket: 0}},
		},
	},
	{
		name:   "daily quota rolls over at UTC midnight",
		limits: quota.Limits{DailyQuota: i64(5)},
		steps: []step{
			{at: "2030-06-10T23:59:59Z", cost: 5, allowed: true, remaining: rem{daily: 0},
				reset: map[quota.LimitName]string{daily: "2030-06-11T00:00:00Z"}, window: map[quota.LimitName]time.Duration{daily: 24 * time.Hour}},
			{at: "2030-06-10T23:59:59Z", cost: 1, violated: []quota.LimitName{daily}, retry: time.Second},
			{at: "2030-06-11T00:00:00Z", cost: 1, allowed: true, remaining: rem{daily: 4}, limit: rem{daily: 5},
				reset: map[quota.LimitName]string{daily: "2030-06-12T00:00:00Z"}},
			{at: "2030-06-11T00:00:00Z", cost: 6, violated: []quota.LimitName{daily}, retry: never},
		},
	},
	{
		name:   "monthly quota rolls over after Feb 29 of a leap year",
		limits: quota.Limits{MonthlyQuota: i64(10)},
		steps: []step{
			{at: "2028-02-29T23:59:59.999999Z", cost: 10, allowed: true, remaining: rem{monthly: 0},
				reset:  map[quota.LimitName]string{monthly: "2028-03-01T00:00:00Z"},
				window: map[quota.LimitName]time.Duration{monthly: 29 * 24 * time.Hour}},
			{at: "2028-02-29T23:59:59.999999Z", cost: 1, violated: []quota.LimitName{monthly}, retry: time.Microsecond},
			{at: "2028-03-01T00:00:00Z", cost: 1, allowed: true, remaining: rem{monthly: 9},
				reset:  map[quota.LimitName]string{monthly: "2028-04-01T00:00:00Z"},
				window: map[quota.LimitName]time.Duration{monthly: 31 * 24 * time.Hour}},
		},
	},
	{
		name:   "monthly quota rolls over after Feb 28 of a common year",
		limits: quota.Limits{MonthlyQuota: i64(1)},
		steps: []step{
			{at: "2029-02-28T12:00:00Z", cost: 1, allowed: true, remaining: rem{monthly: 0},
				reset:  map[quota.LimitName]string{monthly: "2029-03-01T00:00:00Z"},
				window: map[quota.LimitName]time.Duration{monthly: 28 * 24 * time.Hour}},
			{at: "2029-02-28T23:59:59Z", cost: 1, violated: []quota.LimitName{monthly}, retry: time.Second},
			{at: "2029-03-01T00:00:00Z", cost: 1, allowed: true, remaining: rem{monthly: 0}},
		},
	},
	{
		name:   "both quotas roll over on Dec 31",
		limits: quota.Limits{DailyQuota: i64(3), MonthlyQuota: i64(4)},
		steps: []step{
			{at: "2030-12-31T23:59:59Z", cost: 3, allowed: true, remaining: rem{daily: 0, monthly: 1}},
			{at: "2030-12-31T23:59:59Z", cost: 1, violated: []quota.LimitName{daily}, retry: time.Second, remaining: rem{daily: 0, monthly: 1}},
			{at: "2030-12-31T23:59:59Z", cost: 2, violated: []quota.LimitName{daily, monthly}, retry: time.Second},
			{at: "2031-01-01T00:00:00Z", cost: 4, violated: []quota.LimitName{daily}, retry: never},
			{at: "2031-01-01T00:00:00Z", cost: 3, allowed: true, remaining: rem{daily: 0, monthly: 1},
				reset: map[quota.LimitName]string{daily: "2031-01-02T00:00:00Z", monthly: "2031-02-01T00:00:00Z"}},
		},
	},
	{
		name:   "a daily grant raises the limit until midnight",
		limits: quota.Limits{DailyQuota: i64(2)},
		steps: []step{
			{at: "2030-06-10T08:00:00Z", grant: "day", cost: 3},
			{at: "2030-06-10T09:00:00Z", cost: 5, allowed: true, remaining: rem{daily: 0}, limit: rem{daily: 5}},
			{at: "2030-06-10T09:00:00Z", cost: 1, violated: []quota.LimitName{daily}, retry: 15 * time.Hour},
			{at: "2030-06-11T09:00:00Z", cost: 3, violated: []quota.LimitName{daily}, retry: never, limit: rem{daily: 2}},
			{at: "2030-06-11T09:00:00Z", cost: 2, allowed: true, remaining: rem{daily: 0}, limit: rem{daily: 2}},
		},
	},
	{
		name:   "a grant in a stale period starts the new period",
		limits: quota.Limits{MonthlyQuota: i64(2)},
		steps: []step{
			{at: "2030-05-31T09:00:00Z", cost: 2, allowed: true, remaining: rem{monthly: 0}},
			{at: "2030-06-01T09:00:00Z", grant: "month", cost: 5},
			{at: "2030-06-01T09:00:00Z", cost: 7, allowed: true, remaining: rem{monthly: 0}, limit: rem{monthly: 7}},
			{at: "2030-07-01T09:00:00Z", cost: 1, allowed: true, remaining: rem{monthly: 1}, limit: rem{monthly: 2}},
		},
	},
	{
		name:    "block refuses past the monthly quota until a grant",
		limits:  quota.Limits{MonthlyQuota: i64(5)},
		overage: quota.OverageBlock,
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 3, allowed: true, remaining: rem{monthly: 2}},
			{at: "2030-06-10T12:00:00Z", cost: 4, violated: []quota.LimitName{monthly}, retry: 20*24*time.Hour + 12*time.Hour, remaining: rem{monthly: 2}},
			{at: "2030-06-10T12:00:00Z", cost: 6, violated: []quota.LimitName{monthly}, retry: never},
			{at: "2030-06-10T12:00:00Z", cost: 2, allowed: true, remaining: rem{monthly: 0}},
			{at: "2030-06-10T12:00:01Z", grant: "month", cost: 2},
			{at: "2030-06-10T12:00:02Z", cost: 2, allowed: true, remaining: rem{monthly: 0}, limit: rem{monthly: 7}},
		},
	},
	{
		name:    "bill admits past the monthly quota and counts the overage",
		limits:  quota.Limits{MonthlyQuota: i64(5)},
		overage: quota.OverageBill,
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 3, allowed: true, remaining: rem{monthly: 2}},
			{at: "2030-06-10T12:00:00Z", cost: 4, allowed: true, overage: 2, remaining: rem{monthly: 0}},
			{at: "2030-06-10T12:00:00Z", cost: 2, allowed: true, overage: 2, remaining: rem{monthly: 0}},
			{at: "2030-06-10T12:00:00Z", cost: 2, dry: true, allowed: true, overage: 2, remaining: rem{monthly: 0}},
			{at: "2030-06-10T12:00:01Z", grant: "month", cost: 10}, // limit 15, used 9
			{at: "2030-06-10T12:00:02Z", cost: 3, allowed: true, overage: 0, remaining: rem{monthly: 3}},
			{at: "2030-06-10T12:00:02Z", cost: 5, allowed: true, overage: 2, remaining: rem{monthly: 0}},
		},
	},
	{
		name:    "bill keeps the daily quota a hard cap",
		limits:  quota.Limits{DailyQuota: i64(4), MonthlyQuota: i64(2)},
		overage: quota.OverageBill,
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 3, allowed: true, overage: 1, remaining: rem{daily: 1, monthly: 0}},
			{at: "2030-06-10T12:00:00Z", cost: 2, violated: []quota.LimitName{daily}, retry: 12 * time.Hour, overage: 0},
		},
	},
	{
		name:   "unlimited limits are skipped",
		limits: quota.Limits{},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: quota.MaxQuantity, allowed: true, active: []quota.LimitName{}},
			{at: "2030-06-10T12:00:00Z", cost: quota.MaxQuantity, allowed: true, active: []quota.LimitName{}},
		},
	},
	{
		name:   "only the configured limits are reported, in order",
		limits: quota.Limits{BurstRate: f64(1), Burst: i64(5), MonthlyQuota: i64(9)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 2, allowed: true, active: []quota.LimitName{burst, monthly},
				remaining: rem{burst: 4, monthly: 7}},
		},
	},
	{
		name: "a request refused by the monthly quota consumes no burst or bucket room",
		limits: quota.Limits{BurstRate: f64(1), Burst: i64(2), BucketCapacity: i64(5), BucketRefillPerSec: f64(1),
			DailyQuota: i64(100), MonthlyQuota: i64(1)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true, remaining: rem{burst: 1, bucket: 4, daily: 99, monthly: 0}},
			{at: "2030-06-10T12:00:00Z", cost: 1, violated: []quota.LimitName{monthly}, retry: 20*24*time.Hour + 12*time.Hour,
				remaining: rem{burst: 1, bucket: 4, daily: 99, monthly: 0}},
			{at: "2030-06-10T12:00:00Z", cost: 1, violated: []quota.LimitName{monthly}, retry: 20*24*time.Hour + 12*time.Hour},
			{at: "2030-06-10T12:00:00Z", grant: "month", cost: 1},
			// Had the refusals consumed anything, GCRA (burst 2) would refuse now.
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true, remaining: rem{burst: 0, bucket: 3, daily: 98, monthly: 0}},
		},
	},
	{
		name:   "several refusing limits: the longest wait",
		limits: quota.Limits{BurstRate: f64(1), Burst: i64(1), DailyQuota: i64(1)},
		steps: []step{
			{at: "2030-06-10T23:00:00Z", cost: 1, allowed: true},
			{at: "2030-06-10T23:00:00Z", cost: 1, violated: []quota.LimitName{burst, daily}, retry: time.Hour},
			{at: "2030-06-10T23:59:59.5Z", cost: 1, violated: []quota.LimitName{daily}, retry: 500 * time.Millisecond},
			{at: "2030-06-10T23:59:59.5Z", cost: 2, violated: []quota.LimitName{daily}, retry: never},
		},
	},
	{
		name:   "dry run decides without consuming",
		limits: quota.Limits{BurstRate: f64(1), Burst: i64(2), MonthlyQuota: i64(3)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 2, dry: true, allowed: true, remaining: rem{burst: 1, monthly: 1}},
			{at: "2030-06-10T12:00:00Z", cost: 2, dry: true, allowed: true, remaining: rem{burst: 1, monthly: 1}},
			{at: "2030-06-10T12:00:00Z", cost: 4, dry: true, violated: []quota.LimitName{monthly}, retry: never, remaining: rem{burst: 2, monthly: 3}},
			{at: "2030-06-10T12:00:00Z", cost: 2, allowed: true, remaining: rem{burst: 1, monthly: 1}},
			{at: "2030-06-10T12:00:00Z", cost: 1, dry: true, idem: "k", allowed: true, remaining: rem{burst: 0, monthly: 0}},
			{at: "2030-06-10T12:00:00Z", cost: 1, idem: "k", allowed: true, remaining: rem{burst: 0, monthly: 0}},
		},
	},
	{
		name:   "an idempotent repeat replays the first decision for 24 hours",
		limits: quota.Limits{MonthlyQuota: i64(10)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 3, idem: "k", allowed: true, remaining: rem{monthly: 7}},
			{at: "2030-06-10T12:00:01Z", cost: 3, idem: "k", allowed: true, replayed: true, remaining: rem{monthly: 7}},
			{at: "2030-06-10T12:00:01Z", cost: 3, idem: "other", allowed: true, remaining: rem{monthly: 4}},
			{at: "2030-06-11T11:59:59.999999Z", cost: 3, idem: "k", allowed: true, replayed: true, remaining: rem{monthly: 7}},
			{at: "2030-06-11T12:00:00Z", cost: 3, idem: "k", allowed: true, remaining: rem{monthly: 1}},
			{at: "2030-06-11T12:00:00Z", cost: 3, idem: "k", allowed: true, replayed: true, remaining: rem{monthly: 1}},
		},
	},
	{
		name:   "a refused idempotent request is not stored",
		limits: quota.Limits{MonthlyQuota: i64(2)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 2, allowed: true},
			{at: "2030-06-10T12:00:00Z", cost: 1, idem: "k", violated: []quota.LimitName{monthly}, retry: 20*24*time.Hour + 12*time.Hour},
			{at: "2030-06-10T12:00:00Z", grant: "month", cost: 1},
			{at: "2030-06-10T12:00:01Z", cost: 1, idem: "k", allowed: true, remaining: rem{monthly: 0}},
		},
	},
	{
		name:   "an upgrade of the burst limits starts them fresh; a move back down clamps",
		limits: quota.Limits{BurstRate: f64(0.001), Burst: i64(1), BucketCapacity: i64(1), BucketRefillPerSec: f64(0.001)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true},
			{at: "2030-06-10T12:00:01Z", cost: 1, violated: []quota.LimitName{burst, bucket}, retry: 999 * time.Second},
			// upgraded: 100/s, burst 10; bucket 100 units refilled at 100/s:
			// each at least as large, so the old debt is not carried
			{at: "2030-06-10T12:00:01Z", cost: 1, limits: &quota.Limits{BurstRate: f64(100), Burst: i64(10),
				BucketCapacity: i64(100), BucketRefillPerSec: f64(100)},
				allowed: true, remaining: rem{burst: 9, bucket: 99}},
			{at: "2030-06-10T12:00:01Z", cost: 2, allowed: true, remaining: rem{burst: 8, bucket: 97}},
			// a dry run and a peek see the same; then back down: the debt
			// of the fast tier (30 ms) is carried, clamped (it fits)
			{at: "2030-06-10T12:00:01Z", cost: 1, limits: &quota.Limits{BurstRate: f64(0.001), Burst: i64(1),
				BucketCapacity: i64(1), BucketRefillPerSec: f64(0.001)},
				violated: []quota.LimitName{burst, bucket}, retry: 30 * time.Millisecond, remaining: rem{burst: 0, bucket: 0}},
			{at: "2030-06-10T12:00:01.03Z", cost: 1, allowed: true, remaining: rem{burst: 0, bucket: 0}},
		},
	},
	{
		name:   "a change of limits that is not larger in each clamps the old debt to the new limits' worst case",
		limits: quota.Limits{BurstRate: f64(0.001), Burst: i64(2), BucketCapacity: i64(2), BucketRefillPerSec: f64(0.001)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true},
			{at: "2030-06-10T12:00:00Z", cost: 1, allowed: true},
			{at: "2030-06-10T12:00:01Z", cost: 1, violated: []quota.LimitName{burst, bucket}, retry: 999 * time.Second},
			// a faster rate but a smaller burst (and bucket): 100/s, 1
			{at: "2030-06-10T12:00:01Z", cost: 1, limits: &quota.Limits{BurstRate: f64(100), Burst: i64(1),
				BucketCapacity: i64(1), BucketRefillPerSec: f64(100)},
				violated: []quota.LimitName{burst, bucket}, retry: 10 * time.Millisecond,
				remaining: rem{burst: 0, bucket: 0}},
			{at: "2030-06-10T12:00:01.01Z", cost: 1, allowed: true, remaining: rem{burst: 0, bucket: 0}},
			{at: "2030-06-10T12:00:02.01Z", cost: 1, allowed: true, remaining: rem{burst: 0, bucket: 0}},
			// a larger burst but a slower rate: clamped too (the debt fits)
			{at: "2030-06-10T12:00:02.01Z", cost: 1, limits: &quota.Limits{BurstRate: f64(50), Burst: i64(5),
				BucketCapacity: i64(5), BucketRefillPerSec: f64(50)},
				allowed: true, remaining: rem{burst: 3, bucket: 3}},
		},
	},
	{
		name:   "an idempotent request is in flight until its answer is stored, then replayed through the burst limit",
		limits: quota.Limits{BurstRate: f64(1), Burst: i64(2), MonthlyQuota: i64(10)},
		steps: []step{
			{at: "2030-06-10T12:00:00Z", cost: 3, idem: "k", fp: "a", lease: time.Minute, allowed: true, remaining: rem{burst: 1, monthly: 7}},
			{at: "2030-06-10T12:00:00Z", cost: 3, idem: "k", fp: "a", lease: time.Minute, idemOutcome: quota.IdemInFlight},
			{at: "2030-06-10T12:00:00Z", cost: 3, idem: "k", fp: "b", lease: time.Minute, idemOutcome: quota.IdemMismatch},
			{at: "2030-06-10T12:00:00Z", idem: "k", fp: "a", store: true},
			{at: "2030-06-10T12:00:00Z", cost: 3, idem: "k", fp: "a", lease: time.Minute, allowed: true, replayed: true,
				idemOutcome: quota.IdemReplayed, remaining: rem{burst: 0, monthly: 7}},
			// the burst is spent: a replay is refused like any request
			{at: "2030-06-10T12:00:00Z", cost: 3, idem: "k", fp: "a", lease: time.Minute,
				violated: []quota.LimitName{burst}, retry: time.Second, remaining: rem{burst: 0, monthly: 7}},
			{at: "2030-06-10T12:00:01Z", cost: 3, idem: "k", fp: "a", lease: time.Minute, allowed: true, replayed: true,
				idemOutcome: quota.IdemReplayed, remaining: rem{burst: 0, monthly: 7}},
			// a first request whose node died: once its lease passed, the key runs again
			{at: "2030-06-10T12:00:10Z", cost: 1, idem: "j", fp: "a", lease: time.Minute, allowed: true, remaining: rem{monthly: 6}},
			{at: "2030-06-10T12:01:09Z", cost: 1, idem: "j", fp: "a", lease: time.Minute, idemOutcome: quota.IdemInFlight},
			{at: "2030-06-10T12:01:10Z", cost: 1, idem: "j", fp: "a", lease: time.Minute, allowed: true, remaining: rem{monthly: 5}},
		},
	},
}

// TestTable runs every table case through the reference (internal/limits)
// and through the script, so that each expectation holds for both.
func TestTable(t *testing.T) {
	t.Parallel()
	c := testenv.Redis(t)
	for _, tc := range tableCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t.Run("model", func(t *testing.T) {
				var m ref
				runTable(t, tc,
					func(req quota.Request, now time.Time) quota.Decision { return m.Admit(req, now) },
					func(period string, units int64, now time.Time) { m.Grant(period, units, now) },
					func(key, fp string) bool { return m.StoreAnswer(key, fp) })
			})
			t.Run("redis", func(t *testing.T) {
				r, _ := mustRunner(t, c)
				runTable(t, tc,
					func(req quota.Request, now time.Time) quota.Decision {
						req.Now = now
						return mustAdmit(t, r, req)
					},
					func(period string, units int64, now time.Time) {
						if err := r.Grant(context.Background(), req0(tc).TenantID, period, units, now); err != nil {
							t.Fatalf("Grant: %v", err)
						}
					},
					func(key, fp string) bool {
						ok, err := r.StoreAnswer(context.Background(), quota.Request{TenantID: req0(tc).TenantID, IdempotencyKey: key,
							IdempotencyFingerprint: fp, IdempotencyClaim: "claim-" + key}, quota.StoredAnswer{Status: 200})
						if err != nil {
							t.Fatalf("StoreAnswer: %v", err)
						}
						return ok
					})
			})
		})
	}
}

// req0 is the request every step of tc starts from; one fixed tenant per
// case (each case has its own key prefix).
func req0(tc tableCase) quota.Request {
	return quota.Request{TenantID: "t1", Meter: "demo", Limits: tc.limits, Overage: tc.overage}
}

func runTable(t *testing.T, tc tableCase, admit func(quota.Request, time.Time) quota.Decision,
	grant func(string, int64, time.Time), store func(key, fp string) bool) {
	t.Helper()
	for i, s := range tc.steps {
		now := at(t, s.at)
		if s.limits != nil {
			tc.limits = *s.limits
		}
		if s.grant != "" {
			grant(s.grant, s.cost, now)
			continue
		}
		if s.store {
			if !store(s.idem, s.fp) {
				t.Errorf("step %d: storing the answer of %q: got false, want true", i, s.idem)
			}
			continue
		}
		req := req0(tc)
		req.Cost, req.DryRun, req.IdempotencyKey = max(s.cost, 1), s.dry, s.idem
		req.IdempotencyFingerprint, req.IdempotencyLease = s.fp, s.lease
		d := admit(req, now)
		where := func() string { return fmt.Sprintf("step %d (%s): %s", i, s.at, fmtDecision(d)) }
		if d.Allowed != s.allowed {
			t.Errorf("%s\n  Allowed: got %t, want %t", where(), d.Allowed, s.allowed)
		}
		if !slices.Equal(d.Violated, s.violated) {
			t.Errorf("%s\n  Violated: got %v, want %v", where(), d.Violated, s.violated)
		}
		if !s.allowed && d.RetryAfter != s.retry {
			t.Errorf("%s\n  RetryAfter: got %v, want %v", where(), d.RetryAfter, s.retry)
		}
		if d.OverageUnits != s.overage {
			t.Errorf("%s\n  OverageUnits: got %d, want %d", where(), d.OverageUnits, s.overage)
		}
		if d.Replayed() != s.replayed {
			t.Errorf("%s\n  Replayed: got %t, want %t", where(), d.Replayed(), s.replayed)
		}
		wantIdem := s.idemOutcome
		if s.replayed {
			wantIdem = quota.IdemReplayed
		}
		if d.Idem != wantIdem {
			t.Errorf("%s\n  Idem: got %d, want %d", where(), d.Idem, wantIdem)
		}
		if s.active != nil {
			var got []quota.LimitName
			for _, l := range d.Limits {
				got = append(got, l.Name)
			}
			if !slices.Equal(got, s.active) {
				t.Errorf("%s\n  active limits: got %v, want %v", where(), got, s.active)
			}
		}
		for name, want := range s.remaining {
			if l, ok := d.Limit(name); !ok || l.Remaining != want {
				t.Errorf("%s\n  %s remaining: got %d (active %t), want %d", where(), name, l.Remaining, ok, want)
			}
		}
		for name, want := range s.limit {
			if l, ok := d.Limit(name); !ok || l.Limit != want {
				t.Errorf("%s\n  %s limit: got %d (active %t), want %d", where(), name, l.Limit, ok, want)
			}
		}
		for name, want := range s.reset {
			if l, ok := d.Limit(name); !ok || !l.Reset.Equal(at(t, want)) {
				t.Errorf("%s\n  %s reset: got %v (active %t), want %s", where(), name, l.Reset, ok, want)
			}
		}
		for name, want := range s.window {
			if l, ok := d.Limit(name); !ok || l.Window != want {
				t.Errorf("%s\n  %s window: got %v (active %t), want %v", where(), name, l.Window, ok, want)
			}
		}
		if !d.Now.Equal(now) {
			t.Errorf("%s\n  Now: got %v, want %v", where(), d.Now, now)
		}
	}
}
