package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
)

// mustOpenAPI parses the embedded document.
func mustOpenAPI(tb testing.TB) map[string]any {
	tb.Helper()
	var doc map[string]any
	if err := json.Unmarshal(openapiDoc, &doc); err != nil {
		tb.Fatalf("openapi.json is not JSON: %v", err)
	}
	return doc
}

// openapiOps are the keys of a path item that are operations.
var openapiOps = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func TestOpenAPIDocument(t *testing.T) {
	t.Parallel()
	doc := mustOpenAPI(t)
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.1") {
		t.Errorf("openapi = %q, want 3.1.x", v)
	}
	info, _ := doc["info"].(map[string]any)
	if info["title"] != "Tollgate" || info["version"] != "1" {
		t.Errorf("info = %v, want title Tollgate, version 1", info)
	}

	// Every $ref must point at something that exists in the document.
	var walk func(node any, at string)
	walk = func(node any, at string) {
		switch n := node.(type) {
		case map[string]any:
			if r, ok := n["$ref"].(string); ok {
				if _, err := resolvePointer(doc, r); err != nil {
					t.Errorf("%s: $ref %q: %v", at, r, err)
				}
			}
			for k, v := range n {
				walk(v, at+"/"+k)
			}
		case []any:
			for _, v := range n {
				walk(v, at+"/[]")
			}
		}
	}
	walk(doc, "#")

	// Every operation answers at least one response with a schema, and every
	// path parameter in a template is declared.
	paths, _ := doc["paths"].(map[string]any)
	if len(paths) == 0 {
		t.Fatal("the document has no paths")
	}
	tmpl := regexp.MustCompile(`\{([^}]+)\}`)
	for path, item := range paths {
		item, _ := item.(map[string]any)
		declared := pathParams(doc, item["parameters"])
		nops := 0
		for _, method := range openapiOps {
			op, ok := item[method].(map[string]any)
			if !ok {
				continue
			}
			nops++
			if !hasResponseSchema(doc, op) {
				t.Errorf("%s %s: no response has a schema", strings.ToUpper(method), path)
			}
			params := pathParams(doc, op["parameters"])
			for _, m := range tmpl.FindAllStringSubmatch(path, -1) {
				if !declared[m[1]] && !params[m[1]] {
					t.Errorf("%s %s: path parameter %q is not declared", strings.ToUpper(method), path, m[1])
				}
			}
		}
		if nops == 0 {
			t.Errorf("%s: no operations", path)
		}
	}
}

// TestOpenAPICoversEveryRoute fails when a route registered on the app is
// missing from the document.
func TestOpenAPICoversEveryRoute(t *testing.T) {
	t.Parallel()
	s := mustServer(t, nil)
	checked, missing := uncoveredRoutes(s.App(), mustOpenAPI(t))
	for _, m := range missing {
		t.Error(m)
	}
	if !routeRegistered(s, "GET", "/openapi.json") {
		t.Error(`GET /openapi.json is not registered; want s.app.Get("/openapi.json", s.openapi) in routesSetup`)
	}
	t.Logf("checked %d routes: %s", len(checked), strings.Join(checked, ", "))
}

// uncoveredRoutes walks the app's routes and returns those it checked
// ("GET /v1/usage", in OpenAPI syntax) and one message for each route the
// document lacks. Fiber's ":id" becomes "{id}" and the wildcard "/api/*"
// becomes "/api/{path}"; Fiber expands All into one route per method, and a
// literal ALL is covered by get and post.
func uncoveredRoutes(app *fiber.App, doc map[string]any) (checked, missing []string) {
	paths, _ := doc["paths"].(map[string]any)
	param := regexp.MustCompile(`:([A-Za-z0-9_]+)\??`)
	seen := map[string]bool{}
	for _, r := range app.GetRoutes(true) {
		switch r.Method {
		case "HEAD", "OPTIONS", "CONNECT", "TRACE":
			continue
		}
		if r.Path == "/" || r.Path == "" || r.Path == "/*" {
			continue // middleware registered with Use
		}
		path := param.ReplaceAllString(r.Path, "{$1}")
		if strings.HasSuffix(path, "/*") {
			path = strings.TrimSuffix(path, "*") + "{path}"
		}
		key := r.Method + " " + path
		if seen[key] {
			continue
		}
		seen[key] = true
		checked = append(checked, key)

		item, ok := paths[path].(map[string]any)
		if !ok {
			missing = append(missing, fmt.Sprintf("route %s %s: path %s is missing from openapi.json", r.Method, r.Path, path))
			continue
		}
		methods := []string{strings.ToLower(r.Method)}
		if r.Method == "ALL" || r.Method == "USE" {
			methods = []string{"get", "post"}
		}
		for _, m := range methods {
			if _, ok := item[m].(map[string]any); !ok {
				missing = append(missing, fmt.Sprintf("route %s %s: operation %s of %s is missing from openapi.json", r.Method, r.Path, m, path))
			}
		}
	}
	sort.Strings(checked)
	return checked, missing
}

func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	s := mustServer(t, nil)
	if !routeRegistered(s, "GET", "/openapi.json") {
		t.Fatal("GET /openapi.json is not registered: the server must serve its OpenAPI document")
	}
	resp, err := s.App().Test(httptest.NewRequest("GET", "/openapi.json", nil), 10_000)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q, want 200 application/json", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if string(raw) != string(openapiDoc) {
		t.Errorf("served %d bytes, want the %d embedded bytes", len(raw), len(openapiDoc))
	}
}

func routeRegistered(s *Server, method, path string) bool {
	for _, r := range s.App().GetRoutes(true) {
		if r.Method == method && r.Path == path {
			return true
		}
	}
	return false
}

// resolvePointer follows a local JSON pointer such as #/components/schemas/Tier.
func resolvePointer(doc map[string]any, ref string) (any, error) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, errString("only local references are allowed")
	}
	var node any = doc
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := node.(map[string]any)
		if !ok {
			return nil, errString("does not resolve")
		}
		if node, ok = m[tok]; !ok {
			return nil, errString("does not resolve")
		}
	}
	return node, nil
}

type errString string

func (e errString) Error() string { return string(e) }

// deref follows $ref until it reaches a node that is not a reference.
func deref(doc map[string]any, node any) map[string]any {
	for i := 0; i < 10; i++ {
		m, ok := node.(map[string]any)
		if !ok {
			return nil
		}
		r, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		if node, _ = resolvePointer(doc, r); node == nil {
			return nil
		}
	}
	return nil
}

func hasResponseSchema(doc map[string]any, op map[string]any) bool {
	responses, _ := op["responses"].(map[string]any)
	for _, r := range responses {
		content, _ := deref(doc, r)["content"].(map[string]any)
		for _, media := range content {
			if m, _ := media.(map[string]any); m != nil && m["schema"] != nil {
				return true
			}
		}
	}
	return false
}

func pathParams(doc map[string]any, list any) map[string]bool {
	out := map[string]bool{}
	items, _ := list.([]any)
	for _, p := range items {
		if m := deref(doc, p); m != nil && m["in"] == "path" {
			name, _ := m["name"].(string)
			out[name] = true
		}
	}
	return out
}
