package api

import (
	"testing"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/testenv"
)

// BenchmarkTracedMeteredRequest is BenchmarkMeteredRequest with traces on,
// every request sampled and exported to a loopback OTLP/HTTP receiver: the
// price of a server span and its admission span per request. The count is
// the process's: the exporter's work off the request path (encoding the
// batches) and the receiver's, which runs in this process (decoding them),
// are in it too.
//
//	go test -run '^$' -bench BenchmarkTracedMeteredRequest -benchmem ./internal/e2e/api
func BenchmarkTracedMeteredRequest(b *testing.B) {
	s := mustStack(b)
	big := quota.Ptr(quota.MaxQuantity)
	tier := s.tier(999_999, quota.Limits{BurstRate: quota.Ptr(float64(quota.MaxRate)), Burst: quota.Ptr(int64(1 << 30)),
		BucketCapacity: quota.Ptr(int64(1 << 30)), BucketRefillPerSec: quota.Ptr(float64(quota.MaxRate)),
		DailyQuota: big, MonthlyQuota: big})
	_, key := s.tenant(tier.Slug)
	rec := testenv.OTLP(b)
	api := s.startWith(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rec.URL, "OTEL_BSP_SCHEDULE_DELAY": "200"})
	benchAgainstBare(b, api+"/api/demo/echo", key, fiber.StatusOK)
	if len(rec.Spans()) == 0 {
		b.Fatal("no span reached the receiver: traces were not on")
	}
}
