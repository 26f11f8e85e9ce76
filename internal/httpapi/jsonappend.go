package httpapi

import (
	"strconv"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
)

// The demo handlers' answers, written with httpx's JSON append functions.

// builtinBytes is room for a demo handler's answer without growing its
// buffer.
const builtinBytes = 512

// echoBody is the answer of the echo handler.
type echoBody struct {
	tenantID, tier, method, path string
	query                        []byte // as sent, not decoded
	meter                        string
	cost                         int64
	time                         time.Time // of the decision
}

// appendJSON appends e with the members in the order encoding/json gave
// the map it used to be (sorted keys).
func (e echoBody) appendJSON(b []byte) []byte {
	b = append(b, '{')
	b = httpx.AppendJSONKey(b, "cost")
	b = httpx.AppendJSONInt(b, e.cost)
	b = httpx.AppendJSONKey(b, "meter")
	b = httpx.AppendJSONString(b, e.meter)
	b = httpx.AppendJSONKey(b, "method")
	b = httpx.AppendJSONString(b, e.method)
	b = httpx.AppendJSONKey(b, "path")
	b = httpx.AppendJSONString(b, e.path)
	b = httpx.AppendJSONKey(b, "query")
	b = httpx.AppendJSONString(b, e.query)
	b = httpx.AppendJSONKey(b, "tenant_id")
	b = httpx.AppendJSONString(b, e.tenantID)
	b = httpx.AppendJSONKey(b, "tier")
	b = httpx.AppendJSONString(b, e.tier)
	b = httpx.AppendJSONKey(b, "time")
	b = httpx.AppendJSONTime(b, e.time.UTC(), time.RFC3339Nano)
	return append(b, '}')
}

// reportMetrics are the rows of the report handler's made-up report.
var reportMetrics = [...]string{"requests", "errors", "latency_p99_ms"}

// reportBody is the answer of the report handler: a made-up report whose
// values depend only on the tenant, dated by the decision.
type reportBody struct {
	tenantID string
	now      time.Time
}

// appendJSON appends r with the members in the order encoding/json gave
// the map it used to be (sorted keys).
func (r reportBody) appendJSON(b []byte) []byte {
	now := r.now.UTC()
	b = append(b, '{')
	b = httpx.AppendJSONKey(b, "generated_at")
	b = httpx.AppendJSONTime(b, now, time.RFC3339)
	b = httpx.AppendJSONKey(b, "report_id")
	b = append(b, `"rpt_`...)
	b = now.AppendFormat(b, time.DateOnly)
	b = append(b, '_')
	b = strconv.AppendInt(b, r.now.UnixMicro(), 10)
	b = append(b, '"')
	b = httpx.AppendJSONKey(b, "rows")
	b = append(b, '[')
	for i, name := range reportMetrics {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		b = httpx.AppendJSONKey(b, "metric")
		b = httpx.AppendJSONString(b, name)
		b = httpx.AppendJSONKey(b, "value")
		b = httpx.AppendJSONInt(b, int64((len(r.tenantID)+i*7)%100))
		b = append(b, '}')
	}
	b = append(b, ']')
	b = httpx.AppendJSONKey(b, "tenant_id")
	b = httpx.AppendJSONString(b, r.tenantID)
	return append(b, '}')
}
