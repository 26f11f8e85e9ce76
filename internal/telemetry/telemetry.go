// Package telemetry sets up OpenTelemetry traces for Tollgate's binaries,
// configured by the standard OTEL_* variables alone, exported over
// OTLP/HTTP (protobuf). Traces are off unless asked for: Start then returns
// nil, and every caller tests its tracer for nil before it starts a span, so
// that a server without traces pays nothing for them.
//
// It names the span attributes Tollgate's spans carry (Attribute keys) and
// the W3C trace-context propagator every transport uses. It must not set
// OpenTelemetry's process-wide globals (provider, propagator): each server
// holds the tracer it was given, so that two in one process (tests) do not
// share one.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of Tollgate's spans.
const ScopeName = "github.com/tollgate/tollgate"

// The attributes of Tollgate's spans, beside OpenTelemetry's semantic
// conventions (http.*, url.*). None ever holds an API key, a token or a
// request body.
const (
	// TenantID is the tenant's id (a UUID), never its key.
	TenantID = attribute.Key("tollgate.tenant_id")
	// Meter is the meter the request counts against.
	Meter = attribute.Key("tollgate.meter")
	// Cost is the units the request costs (the route's, or the check's).
	Cost = attribute.Key("tollgate.cost")
	// Decision is the admission's outcome: DecisionAllowed,
	// DecisionRefused, DecisionReplayed, DecisionDegraded or
	// DecisionUnavailable.
	Decision = attribute.Key("tollgate.decision")
	// Violated lists the limits that refused a request.
	Violated = attribute.Key("tollgate.violated")
	// FailOpen is true on a decision made without Redis (the tier fails
	// open and Redis did not answer in time).
	FailOpen = attribute.Key("tollgate.fail_open")
	// Idempotency is why an idempotent request was refused: "conflict"
	// (its key in flight, or reused for another request) or "limit" (the
	// tenant's records full).
	Idempotency = attribute.Key("tollgate.idempotency")
	// DryRun is true on a check that consumed nothing.
	DryRun = attribute.Key("tollgate.dry_run")
	// RequestID is the id of a reserved request (a settle route's, or a
	// counted check's) that /v1/settle, /v1/refund and /v1/release name.
	RequestID = attribute.Key("tollgate.request_id")
	// Step is the worker step a span runs.
	Step = attribute.Key("tollgate.step")
	// FailedSteps counts the steps of a worker cycle that failed.
	FailedSteps = attribute.Key("tollgate.failed_steps")
)

// The values of Decision.
const (
	DecisionAllowed  = "allowed"
	DecisionRefused  = "refused"
	DecisionReplayed = "replayed"
	// DecisionDegraded: a degrade policy answered its fallback.
	DecisionDegraded = "degraded"
	// DecisionUnavailable: no decision could be made (Redis away on a tier
	// that does not fail open, or another failure).
	DecisionUnavailable = "unavailable"
)

// Propagator is the W3C trace-context propagator (traceparent,
// tracestate) every transport extracts from incoming requests and injects
// into outgoing ones.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// StartServer starts the server span of a request on tracer, named name
// ("POST /v1/check", "/tollgate.Decide/Check"), continuing the caller's
// trace that carrier holds (its traceparent), and returns ctx with the
// span. With tracer nil it returns ctx as it is and a span that records
// nothing: a caller on a hot path tests its tracer for nil first, so as not
// to build the attributes.
func StartServer(ctx context.Context, tracer trace.Tracer, name string, carrier propagation.TextMapCarrier, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if tracer == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	ctx = Propagator.Extract(ctx, carrier)
	return tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// MetadataCarrier is gRPC metadata (metadata.MD: lower-case keys, each
// with its values) as a propagation carrier: MetadataCarrier(md).
type MetadataCarrier map[string][]string

// Get returns the first value of key.
func (m MetadataCarrier) Get(key string) string {
	if v := m[strings.ToLower(key)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set sets key's one value.
func (m MetadataCarrier) Set(key, value string) { m[strings.ToLower(key)] = []string{value} }

// Keys lists the keys.
func (m MetadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// Traces is a running trace pipeline: a tracer provider with a batch span
// processor and an OTLP/HTTP exporter.
type Traces struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
}

// Tracer returns the tracer of Tollgate's spans, or nil when t is nil
// (traces off): callers test it for nil before they start a span.
func (t *Traces) Tracer() trace.Tracer {
	if t == nil {
		return nil
	}
	return t.tracer
}

// ShutdownTimeout bounds the export of the last spans at shutdown.
const ShutdownTimeout = 5 * time.Second

// Shutdown exports the spans still buffered and stops the pipeline, within
// ctx. It does nothing when t is nil.
func (t *Traces) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Enabled reports whether the variables getenv reads turn traces on:
// OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) with
// OTEL_TRACES_EXPORTER unset; never when OTEL_SDK_DISABLED is true or
// OTEL_TRACES_EXPORTER is none.
func Enabled(getenv func(string) string) bool {
	on, _ := enabled(getenv)
	return on
}

func enabled(getenv func(string) string) (bool, error) {
	if disabled := env(getenv, "OTEL_SDK_DISABLED"); disabled != "" {
		b, err := strconv.ParseBool(disabled)
		if err != nil {
			return false, fmt.Errorf("OTEL_SDK_DISABLED: %q is not true or false", disabled)
		}
		if b {
			return false, nil
		}
	}
	switch exp := strings.ToLower(env(getenv, "OTEL_TRACES_EXPORTER")); exp {
	case "otlp":
		return true, nil
	case "none":
		return false, nil
	case "":
		return env(getenv, "OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env(getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (otlp or none)", exp)
	}
}

// Start starts the trace pipeline the OTEL_* variables getenv reads
// describe, naming the service service unless OTEL_SERVICE_NAME (or
// service.name in OTEL_RESOURCE_ATTRIBUTES) names it. It returns nil, nil
// when traces are off (see Enabled), and an error naming the variable at
// fault when one is invalid. It dials nothing: an exporter that cannot
// reach its endpoint loses spans, it does not stop the binary.
//
// The variables read: OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER,
// OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL
// (http/protobuf only), OTEL_EXPORTER_OTLP_[TRACES_]HEADERS,
// OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT,
// OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*.
// The exporter's TLS variables (certificates) are read by the exporter from
// the process's environment.
func Start(ctx context.Context, service string, getenv func(string) string) (*Traces, error) {
	on, err := enabled(getenv)
	if err != nil || !on {
		return nil, err
	}
	exp, err := exporterOptions(getenv)
	if err != nil {
		return nil, err
	}
	exporter, err := otlptracehttp.New(ctx, exp...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	sampler, err := samplerOf(getenv)
	if err != nil {
		return nil, err
	}
	bsp, err := batchOptions(getenv)
	if err != nil {
		return nil, err
	}
	res, err := resourceOf(ctx, service, getenv)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter, bsp...),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res),
	)
	return &Traces{provider: tp, tracer: tp.Tracer(ScopeName)}, nil
}

// env is getenv(name), trimmed.
func env(getenv func(string) string, name string) string { return strings.TrimSpace(getenv(name)) }

// either is the traces-specific variable's value, else the general one's,
// with the name of the one that gave it.
func either(getenv func(string) string, suffix string) (value, name string) {
	name = "OTEL_EXPORTER_OTLP_TRACES_" + suffix
	if v := env(getenv, name); v != "" {
		return v, name
	}
	name = "OTEL_EXPORTER_OTLP_" + suffix
	return env(getenv, name), name
}

// DefaultEndpoint is where spans go when traces are on and no endpoint is
// set: a collector on the same host.
const DefaultEndpoint = "http://localhost:4318/v1/traces"

// endpoint is the URL spans are posted to: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// as it is, else OTEL_EXPORTER_OTLP_ENDPOINT with /v1/traces appended, else
// DefaultEndpoint.
func endpoint(getenv func(string) string) (string, error) {
	raw, name := env(getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	full := raw != ""
	if !full {
		raw, name = env(getenv, "OTEL_EXPORTER_OTLP_ENDPOINT"), "OTEL_EXPORTER_OTLP_ENDPOINT"
	}
	if raw == "" {
		return DefaultEndpoint, nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return "", fmt.Errorf("%s: %q is not an http:// or https:// URL with a host", name, raw)
	}
	if !full {
		u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
		u.RawPath = ""
	}
	return u.String(), nil
}

func exporterOptions(getenv func(string) string) ([]otlptracehttp.Option, error) {
	if proto, name := either(getenv, "PROTOCOL"); proto != "" && proto != "http/protobuf" {
		return nil, fmt.Errorf("%s: %q is not supported (http/protobuf)", name, proto)
	}
	ep, err := endpoint(getenv)
	if err != nil {
		return nil, err
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(ep)}
	if raw, name := either(getenv, "HEADERS"); raw != "" {
		h, err := pairs(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		opts = append(opts, otlptracehttp.WithHeaders(h))
	}
	if raw, name := either(getenv, "TIMEOUT"); raw != "" {
		d, err := millis(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		opts = append(opts, otlptracehttp.WithTimeout(d))
	}
	switch raw, name := either(getenv, "COMPRESSION"); raw {
	case "", "none":
		opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.NoCompression))
	case "gzip":
		opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	default:
		return nil, fmt.Errorf("%s: %q is not supported (gzip or none)", name, raw)
	}
	return opts, nil
}

// samplerOf is OTEL_TRACES_SAMPLER's sampler (with OTEL_TRACES_SAMPLER_ARG),
// parentbased_always_on when it is unset.
func samplerOf(getenv func(string) string) (sdktrace.Sampler, error) {
	name := strings.ToLower(env(getenv, "OTEL_TRACES_SAMPLER"))
	arg := env(getenv, "OTEL_TRACES_SAMPLER_ARG")
	ratio := func() (sdktrace.Sampler, error) {
		if arg == "" {
			return sdktrace.TraceIDRatioBased(1), nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG: %q is not a ratio between 0 and 1", arg)
		}
		return sdktrace.TraceIDRatioBased(r), nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "traceidratio":
		return ratio()
	case "parentbased_traceidratio":
		s, err := ratio()
		if err != nil {
			return nil, err
		}
		return sdktrace.ParentBased(s), nil
	}
	return nil, fmt.Errorf("OTEL_TRACES_SAMPLER: %q is not supported (always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio)", name)
}

// batchOptions are the batch span processor's OTEL_BSP_* settings.
func batchOptions(getenv func(string) string) ([]sdktrace.BatchSpanProcessorOption, error) {
	var opts []sdktrace.BatchSpanProcessorOption
	for _, v := range []struct {
		name     string
		duration func(time.Duration) sdktrace.BatchSpanProcessorOption
		size     func(int) sdktrace.BatchSpanProcessorOption
	}{
		{name: "OTEL_BSP_SCHEDULE_DELAY", duration: sdktrace.WithBatchTimeout},
		{name: "OTEL_BSP_EXPORT_TIMEOUT", duration: sdktrace.WithExportTimeout},
		{name: "OTEL_BSP_MAX_QUEUE_SIZE", size: sdktrace.WithMaxQueueSize},
		{name: "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", size: sdktrace.WithMaxExportBatchSize},
	} {
		raw := env(getenv, v.name)
		if raw == "" {
			continue
		}
		if v.duration != nil {
			d, err := millis(raw)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			opts = append(opts, v.duration(d))
			continue
		}
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive integer", v.name, raw)
		}
		opts = append(opts, v.size(n))
	}
	return opts, nil
}

// millis parses a positive number of milliseconds.
func millis(raw string) (time.Duration, error) {
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 1 || n > int64(24*time.Hour/time.Millisecond) {
		return 0, fmt.Errorf("%q is not a number of milliseconds between 1 and 86400000", raw)
	}
	return time.Duration(n) * time.Millisecond, nil
}

// resourceOf describes the process: service.name (OTEL_SERVICE_NAME, else
// OTEL_RESOURCE_ATTRIBUTES' service.name, else service), the attributes of
// OTEL_RESOURCE_ATTRIBUTES, and the SDK's own.
func resourceOf(ctx context.Context, service string, getenv func(string) string) (*resource.Resource, error) {
	var attrs []attribute.KeyValue
	if raw := env(getenv, "OTEL_RESOURCE_ATTRIBUTES"); raw != "" {
		kv, err := pairs(raw)
		if err != nil {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
		}
		for k, v := range kv {
			if k == "service.name" {
				service = v
				continue
			}
			attrs = append(attrs, attribute.String(k, v))
		}
	}
	if name := env(getenv, "OTEL_SERVICE_NAME"); name != "" {
		service = name
	}
	attrs = append(attrs, attribute.String("service.name", service))
	r, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return r, nil
}

// pairs parses the key=value,key=value lists of OTEL_RESOURCE_ATTRIBUTES and
// the OTLP headers: values percent-encoded, keys not empty.
func pairs(raw string) (map[string]string, error) {
	m := map[string]string{}
	for i, item := range strings.Split(raw, ",") {
		k, v, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			// (the item is not quoted: a header's may hold a secret)
			return nil, fmt.Errorf("item %d is not a key=value pair", i+1)
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("the value of %s is not percent-encoded", k)
		}
		m[k] = val
	}
	return m, nil
}
