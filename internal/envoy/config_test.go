package envoy

import (
	"os"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	// The types the configurations' typed_config and protocol options name.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// parseBootstrap reads an Envoy bootstrap in YAML as Envoy does: YAML to
// JSON, protojson (unknown fields and unknown Any types are errors), then
// the validation rules of every message, those inside Any included.
func parseBootstrap(yml []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(yml)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return nil, err
	}
	if err := validateDeep(&b); err != nil {
		return nil, err
	}
	return &b, nil
}

// validateDeep runs m's ValidateAll and that of every message packed in an
// Any below it, which ValidateAll does not open.
func validateDeep(m proto.Message) error {
	if a, ok := m.(*anypb.Any); ok {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return err
		}
		m = inner
	}
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return err
		}
	}
	var err error
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = validateDeep(v.List().Get(i).Message().Interface())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				err = validateDeep(mv.Message().Interface())
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = validateDeep(v.Message().Interface())
		}
		return err == nil
	})
	return err
}

// routesOf is the routes of the bootstrap's one listener's connection
// manager.
func routesOf(t *testing.T, b *bootstrapv3.Bootstrap) (*hcmv3.HttpConnectionManager, []*routev3.Route) {
	t.Helper()
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	return &hcm, hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()
}

// TestDocumentedEnvoyConfigurationsAreValid: the two configurations of
// docs/envoy.md are bootstraps Envoy accepts, that ask Tollgate's cluster
// over HTTP/2 with what Tollgate reads; a misspelt field or a value out of
// range fails.
func TestDocumentedEnvoyConfigurationsAreValid(t *testing.T) {
	for _, tc := range []struct {
		file, filter string
		misspelt     [2]string
	}{
		{"ratelimit.yaml", "envoy.filters.http.ratelimit", [2]string{"descriptor_key: api_key", "descriptor_kye: api_key"}},
		{"ext_authz.yaml", "envoy.filters.http.ext_authz", [2]string{"context_extensions:", "context_extension:"}},
	} {
		raw, err := os.ReadFile("../../docs/envoy/" + tc.file)
		if err != nil {
			t.Fatal(err)
		}
		b, err := parseBootstrap(raw)
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		var tollgate bool
		for _, c := range b.GetStaticResources().GetClusters() {
			if c.GetName() == "tollgate" {
				opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
				tollgate = opts != nil && strings.Contains(protojson.Format(opts), "http2ProtocolOptions") && len(c.GetHealthChecks()) == 1 &&
					c.GetHealthChecks()[0].GetGrpcHealthCheck() != nil
			}
		}
		if !tollgate {
			t.Errorf("%s: no cluster tollgate over HTTP/2 with a gRPC health check", tc.file)
		}
		hcm, routes := routesOf(t, b)
		var names []string
		for _, f := range hcm.GetHttpFilters() {
			names = append(names, f.GetName())
		}
		if len(names) < 2 || !strings.Contains(strings.Join(names, " "), tc.filter) || names[len(names)-1] != "envoy.filters.http.router" {
			t.Errorf("%s: filters %v, want %s before the router, last", tc.file, names, tc.filter)
		}
		if tc.file == "ratelimit.yaml" {
			for _, r := range routes {
				keys := map[string]bool{}
				for _, a := range r.GetRoute().GetRateLimits()[0].GetActions() {
					if h := a.GetRequestHeaders(); h != nil {
						keys[h.GetDescriptorKey()] = true
					}
					if g := a.GetGenericKey(); g != nil {
						keys[g.GetDescriptorKey()] = true
					}
				}
				if !keys[entryAPIKey] || !keys[entryMeter] || !keys[entryPath] {
					t.Errorf("%s: route %s sends entries %v, want api_key, meter and path", tc.file, r.GetMatch().GetPrefix(), keys)
				}
			}
		}

		bad := strings.Replace(string(raw), tc.misspelt[0], tc.misspelt[1], 1)
		if bad == string(raw) {
			t.Fatalf("%s: %q not found to misspell", tc.file, tc.misspelt[0])
		}
		if _, err := parseBootstrap([]byte(bad)); err == nil {
			t.Errorf("%s with %q: parsed, want an unknown field error", tc.file, tc.misspelt[1])
		}
		outOfRange := strings.Replace(string(raw), "port_value: 9090", "port_value: 90000", 1)
		if _, err := parseBootstrap([]byte(outOfRange)); err == nil || !strings.Contains(err.Error(), "PortValue") {
			t.Errorf("%s with port 90000: %v, want a validation error naming PortValue", tc.file, err)
		}
	}
}
