package telemetry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/tollgate/tollgate/internal/telemetry"
	"github.com/tollgate/tollgate/internal/testenv"
)

func getenv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

func TestTracesAreOnOnlyWhenAskedFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		on   bool
	}{
		{"nothing set", map[string]string{}, false},
		{"a service name alone", map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, false},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{"exporter OTLP, any case", map[string]string{"OTEL_TRACES_EXPORTER": " OTLP "}, true},
		{"an endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{"a traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{"exporter none beats an endpoint", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false},
		{"SDK disabled beats otlp", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, false},
		{"SDK disabled beats an endpoint", map[string]string{"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, false},
		{"SDK not disabled", map[string]string{"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := telemetry.Enabled(getenv(tc.env)); got != tc.on {
				t.Errorf("Enabled = %v, want %v", got, tc.on)
			}
			tr, err := telemetry.Start(context.Background(), "tollgate-test", getenv(tc.env))
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
			if got := tr != nil && tr.Tracer() != nil; got != tc.on {
				t.Errorf("Start gave a tracer: %v, want %v", got, tc.on)
			}
			if !tc.on && (tr.Tracer() != nil || tr.Shutdown(context.Background()) != nil) {
				t.Error("traces off: Tracer() must be nil and Shutdown a no-op")
			}
		})
	}
}

func TestBadVariablesAreNamed(t *testing.T) {
	t.Parallel()
	on := map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}
	for _, tc := range []struct {
		name, value string
	}{
		{"OTEL_SDK_DISABLED", "perhaps"},
		{"OTEL_TRACES_EXPORTER", "zipkin"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://collector:4318"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://user:pass@collector/v1/traces"},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"},
		{"OTEL_EXPORTER_OTLP_HEADERS", "novalue"},
		{"OTEL_EXPORTER_OTLP_TIMEOUT", "-5"},
		{"OTEL_EXPORTER_OTLP_COMPRESSION", "br"},
		{"OTEL_TRACES_SAMPLER", "sometimes"},
		{"OTEL_TRACES_SAMPLER_ARG", "1.5"},
		{"OTEL_BSP_SCHEDULE_DELAY", "soon"},
		{"OTEL_BSP_MAX_QUEUE_SIZE", "0"},
		{"OTEL_RESOURCE_ATTRIBUTES", "=orphan"},
	} {
		env := map[string]string{tc.name: tc.value}
		for k, v := range on {
			if _, set := env[k]; !set {
				env[k] = v
			}
		}
		if tc.name == "OTEL_TRACES_SAMPLER_ARG" {
			env["OTEL_TRACES_SAMPLER"] = "traceidratio"
		}
		tr, err := telemetry.Start(context.Background(), "tollgate-test", getenv(env))
		if err == nil {
			_ = tr.Shutdown(context.Background())
			t.Errorf("%s=%q: Start succeeded, want an error", tc.name, tc.value)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%q: error %q does not name the variable", tc.name, tc.value, err)
		}
	}
}

// A header the exporter sends may hold a secret: an error about it does
// not repeat it.
func TestHeaderErrorsDoNotRepeatTheValue(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"Authorization Bearer s3cret-token", "Authorization=Bearer%zzs3cret-token"} {
		_, err := telemetry.Start(context.Background(), "x", getenv(map[string]string{
			"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_HEADERS": raw}))
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("headers %q: error %v, want one that does not hold the value", raw, err)
		}
	}
}

// startTraces starts a pipeline that exports to rec and is shut down at
// cleanup.
func startTraces(t *testing.T, env map[string]string) *telemetry.Traces {
	t.Helper()
	tr, err := telemetry.Start(context.Background(), "tollgate-test", getenv(env))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if tr == nil {
		t.Fatal("Start returned no pipeline: traces off")
	}
	t.Cleanup(func() { _ = tr.Shutdown(context.Background()) })
	return tr
}

// Shutdown exports what is buffered: the schedule delay is an hour, so a
// span is at the receiver when Shutdown returns only because it flushed.
func TestShutdownFlushesToTheEndpoint(t *testing.T) {
	t.Parallel()
	rec := testenv.OTLP(t)
	tr := startTraces(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": rec.URL,
		"OTEL_BSP_SCHEDULE_DELAY":     "3600000",
		"OTEL_SERVICE_NAME":           "tollgate-lab",
		"OTEL_RESOURCE_ATTRIBUTES":    "deployment.environment=test%20lab,service.name=overridden",
		"OTEL_EXPORTER_OTLP_HEADERS":  "X-Collector-Tenant=acme%2Fone",
	})
	_, span := tr.Tracer().Start(context.Background(), "unit")
	span.End()
	if n := len(rec.Spans()); n != 0 {
		t.Fatalf("%d spans exported before Shutdown with an hour's delay: the delay was not applied", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	spans := rec.Spans()
	if len(spans) != 1 {
		t.Fatalf("receiver took %d spans after Shutdown, want 1 (refused: %q)", len(spans), rec.Refused())
	}
	s := spans[0]
	if s.Name != "unit" || s.Scope != telemetry.ScopeName {
		t.Errorf("span %q of scope %q, want unit of %s", s.Name, s.Scope, telemetry.ScopeName)
	}
	if got := s.Resource["service.name"]; got != "tollgate-lab" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's tollgate-lab", got)
	}
	if got := s.Resource["deployment.environment"]; got != "test lab" {
		t.Errorf("deployment.environment %q, want OTEL_RESOURCE_ATTRIBUTES' %q", got, "test lab")
	}
	if got := rec.Headers()[0].Get("X-Collector-Tenant"); got != "acme/one" {
		t.Errorf("X-Collector-Tenant %q, want OTEL_EXPORTER_OTLP_HEADERS' acme/one", got)
	}
}

func TestEndpointsAndSamplers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  func(url string) map[string]string
		want int // spans of 4 exported
		svc  string
	}{
		{"the base endpoint gets /v1/traces", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u + "/"}
		}, 4, "tollgate-test"},
		{"the traces endpoint is used as it is, before the base one", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": u + "/v1/traces", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
		}, 4, "tollgate-test"},
		{"service.name of the resource attributes", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u, "OTEL_RESOURCE_ATTRIBUTES": "service.name=billing-edge"}
		}, 4, "billing-edge"},
		{"gzip", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u, "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}
		}, 4, "tollgate-test"},
		{"always_off", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u, "OTEL_TRACES_SAMPLER": "always_off"}
		}, 0, ""},
		{"a ratio of 0", func(u string) map[string]string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": u, "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
		}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := testenv.OTLP(t)
			tr := startTraces(t, tc.env(rec.URL))
			for range 4 {
				_, span := tr.Tracer().Start(context.Background(), "sampled?")
				span.End()
			}
			_ = tr.Shutdown(context.Background())
			spans := rec.Spans()
			if len(spans) != tc.want {
				t.Fatalf("receiver took %d spans, want %d (refused: %q)", len(spans), tc.want, rec.Refused())
			}
			for _, s := range spans {
				if s.Resource["service.name"] != tc.svc {
					t.Errorf("service.name %q, want %q", s.Resource["service.name"], tc.svc)
				}
				if s.Kind != tracepb.Span_SPAN_KIND_INTERNAL {
					t.Errorf("kind %v, want internal", s.Kind)
				}
			}
			if gz := tc.env(rec.URL)["OTEL_EXPORTER_OTLP_COMPRESSION"] == "gzip"; len(spans) > 0 &&
				(rec.Headers()[0].Get("Content-Encoding") == "gzip") != gz {
				t.Errorf("Content-Encoding %q, want gzip: %v", rec.Headers()[0].Get("Content-Encoding"), gz)
			}
		})
	}
}

// StartServer continues the trace of gRPC-style metadata (lower-case keys)
// in a server span; with no tracer it changes nothing.
func TestStartServerContinuesTheCallersTrace(t *testing.T) {
	t.Parallel()
	rec := testenv.OTLP(t)
	tr := startTraces(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rec.URL})
	md := telemetry.MetadataCarrier{"traceparent": {"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	ctx, span := telemetry.StartServer(context.Background(), tr.Tracer(), "/tollgate.v1.Decide/Check", md, telemetry.TenantID.String("t-1"))
	if got := trace.SpanFromContext(ctx).SpanContext().TraceID().String(); got != "0af7651916cd43dd8448eb211c80319c" {
		t.Errorf("the context's trace %s, want the caller's", got)
	}
	span.End()
	out := telemetry.MetadataCarrier{}
	telemetry.Propagator.Inject(ctx, out)
	if got := out.Get("Traceparent"); !strings.HasPrefix(got, "00-0af7651916cd43dd8448eb211c80319c-") || strings.Contains(got, "b7ad6b7169203331") {
		t.Errorf("injected traceparent %q, want the caller's trace with the server span's id", got)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rec.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	if s := spans[0]; s.ParentID != "b7ad6b7169203331" || s.Kind != tracepb.Span_SPAN_KIND_SERVER || s.Attrs["tollgate.tenant_id"] != "t-1" {
		t.Errorf("span parent %s kind %v attrs %v, want parent b7ad6b7169203331, server, tenant t-1", s.ParentID, s.Kind, s.Attrs)
	}

	base := context.Background()
	ctx, span = telemetry.StartServer(base, nil, "off", md)
	if ctx != base || span.IsRecording() || span.SpanContext().IsValid() {
		t.Error("StartServer with no tracer: want ctx unchanged and a span that records nothing")
	}
	span.End()
}
