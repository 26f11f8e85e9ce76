package testenv

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// OTLPReceiver is an OTLP/HTTP trace receiver on loopback, as a collector
// is: it takes POST /v1/traces with an application/x-protobuf
// ExportTraceServiceRequest (gzipped or not) and keeps every span it
// decodes.
type OTLPReceiver struct {
	// URL is the receiver's base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
	URL string

	mu      sync.Mutex
	spans   []Span
	headers []http.Header // of each export taken
	bad     []string      // what it refused, and why
}

// Span is one span the receiver took, with its resource's attributes.
type Span struct {
	TraceID, SpanID, ParentID string // hex; ParentID "" for a root
	Name                      string
	Kind                      tracepb.Span_SpanKind
	Attrs                     map[string]string // every value as text
	Status                    tracepb.Status_StatusCode
	Resource                  map[string]string
	Scope                     string
}

// OTLP starts a receiver that lives as long as the test.
func OTLP(tb testing.TB) *OTLPReceiver {
	tb.Helper()
	r := &OTLPReceiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	tb.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *OTLPReceiver) serve(w http.ResponseWriter, req *http.Request) {
	refuse := func(status int, why string) {
		r.mu.Lock()
		r.bad = append(r.bad, fmt.Sprintf("%s %s: %s", req.Method, req.URL.Path, why))
		r.mu.Unlock()
		http.Error(w, why, status)
	}
	switch {
	case req.URL.Path != "/v1/traces":
		refuse(http.StatusNotFound, "not /v1/traces")
		return
	case req.Method != http.MethodPost:
		refuse(http.StatusMethodNotAllowed, "not POST")
		return
	case req.Header.Get("Content-Type") != "application/x-protobuf":
		refuse(http.StatusUnsupportedMediaType, "Content-Type "+req.Header.Get("Content-Type"))
		return
	}
	var rd io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			refuse(http.StatusBadRequest, "gzip: "+err.Error())
			return
		}
		rd = zr
	}
	body, err := io.ReadAll(rd)
	if err != nil {
		refuse(http.StatusBadRequest, err.Error())
		return
	}
	var ex coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &ex); err != nil {
		refuse(http.StatusBadRequest, "not an ExportTraceServiceRequest: "+err.Error())
		return
	}
	var got []Span
	for _, rs := range ex.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				got = append(got, Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
					Attrs: attrs(s.GetAttributes()), Status: s.GetStatus().GetCode(), Resource: res,
					Scope: ss.GetScope().GetName(),
				})
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.headers = append(r.headers, req.Header.Clone())
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// attrs renders OTLP attributes as text: a string as it is, a list as its
// items joined by ",", anything else as fmt prints it.
func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonpb.AnyValue_ArrayValue:
		items := make([]string, 0, len(x.ArrayValue.GetValues()))
		for _, it := range x.ArrayValue.GetValues() {
			items = append(items, value(it))
		}
		return strings.Join(items, ",")
	case *commonpb.AnyValue_BytesValue:
		return string(x.BytesValue)
	}
	return v.String()
}

// Spans returns the spans taken so far.
func (r *OTLPReceiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Headers returns the request headers of each export taken.
func (r *OTLPReceiver) Headers() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.headers...)
}

// Refused returns what the receiver refused (not an OTLP/HTTP protobuf
// export), one line each.
func (r *OTLPReceiver) Refused() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// WaitFor waits up to timeout for the spans to hold one that match
// accepts, and returns it; it fails tb, listing the span names taken,
// when none comes.
func (r *OTLPReceiver) WaitFor(tb testing.TB, timeout time.Duration, what string, match func(Span) bool) Span {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := r.Spans()
		for _, s := range spans {
			if match(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			names := make([]string, len(spans))
			for i, s := range spans {
				names[i] = s.Name
			}
			tb.Fatalf("no span %s within %s; the receiver took %d: %q (refused: %q)", what, timeout, len(spans), names, r.Refused())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
