// Package oas30 rewrites an OpenAPI 3.1 document into the OpenAPI 3.0 that
// oapi-codegen reads. It knows the 3.1 constructs Tollgate's document uses
// and fails on none: what 3.0 cannot say is dropped or widened, never
// guessed at. It must not be imported by the SDK's runtime packages: it
// serves only the generate step.
package oas30

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Convert returns doc (an OpenAPI 3.1 JSON document) as OpenAPI 3.0.3:
//   - "type": [T, "null"] becomes "type": T with "nullable": true, and
//     "type": "null" alone a nullable schema of no type;
//   - anyOf/oneOf of one schema and {"type": "null"} becomes that schema,
//     nullable (a $ref stays a bare $ref, as 3.0 ignores its siblings);
//   - a $ref into a schema's inside (#/components/schemas/X/properties/y)
//     is replaced by a copy of what it points to, which oapi-codegen
//     cannot name;
//   - "const": v becomes "enum": [v];
//   - "examples" (a list in a schema) becomes "example" (its first);
//   - contentMediaType, patternProperties, unevaluatedProperties, $schema
//     and a top-level jsonSchemaDialect or webhooks are dropped.
//
// The output is indented JSON with sorted keys, the same for the same input.
func Convert(doc []byte) ([]byte, error) {
	var root map[string]any
	if err := json.Unmarshal(doc, &root); err != nil {
		return nil, fmt.Errorf("oas30: parse: %w", err)
	}
	v, _ := root["openapi"].(string)
	if !strings.HasPrefix(v, "3.1") {
		return nil, fmt.Errorf("oas30: openapi %q: want a 3.1 document", v)
	}
	c := converter{root: root}
	out := c.walk(root, "#", 0).(map[string]any)
	if c.err != nil {
		return nil, c.err
	}
	out["openapi"] = "3.0.3"
	delete(out, "jsonSchemaDialect")
	delete(out, "webhooks")
	if info, ok := out["info"].(map[string]any); ok {
		if lic, ok := info["license"].(map[string]any); ok {
			delete(lic, "identifier")
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("oas30: encode: %w", err)
	}
	return append(b, '\n'), nil
}

type converter struct {
	root map[string]any
	err  error
}

// maxDepth bounds the inlining of deep references (a cycle of them).
const maxDepth = 64

func (c *converter) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("oas30: "+format, args...)
	}
}

// walk converts x, found at JSON pointer at, into a new value.
func (c *converter) walk(x any, at string, depth int) any {
	if depth > maxDepth {
		c.fail("%s: references nest deeper than %d", at, maxDepth)
		return x
	}
	switch v := x.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = c.walk(e, fmt.Sprintf("%s/%d", at, i), depth)
		}
		return out
	case map[string]any:
		return c.object(v, at, depth)
	}
	return x
}

func (c *converter) object(v map[string]any, at string, depth int) any {
	if ref, ok := v["$ref"].(string); ok && deep(ref) {
		target, err := c.resolve(ref)
		if err != nil {
			c.fail("%s: %v", at, err)
			return v
		}
		return c.walk(target, ref, depth+1)
	}
	out := make(map[string]any, len(v))
	for k, e := range v {
		switch k {
		case "contentMediaType", "patternProperties", "unevaluatedProperties", "$schema":
			continue
		case "properties", "headers", "responses", "content", "parameters", "schemas", "paths",
			"securitySchemes", "requestBodies", "examples":
			// maps whose keys are names: keep every key, convert the values
			if m, ok := e.(map[string]any); ok && (k != "examples" || !isSchemaLike(v)) {
				names := make(map[string]any, len(m))
				for name, val := range m {
					names[name] = c.walk(val, at+"/"+k+"/"+name, depth)
				}
				out[k] = names
				continue
			}
		}
		out[k] = c.walk(e, at+"/"+k, depth)
	}
	if out["type"] == "null" { // only null: 3.0 says "nullable, of no type"
		delete(out, "type")
		out["nullable"] = true
	}
	if types, ok := out["type"].([]any); ok {
		var kept []any
		nullable := false
		for _, t := range types {
			if t == "null" {
				nullable = true
			} else {
				kept = append(kept, t)
			}
		}
		switch len(kept) {
		case 0:
			delete(out, "type")
		case 1:
			out["type"] = kept[0]
		default:
			delete(out, "type") // 3.0 has no union of types: any
		}
		if nullable {
			out["nullable"] = true
		}
	}
	if cv, ok := out["const"]; ok {
		delete(out, "const")
		out["enum"] = []any{cv}
		if _, typed := out["type"]; !typed {
			if t := jsonType(cv); t != "" {
				out["type"] = t
			}
		}
	}
	if ex, ok := out["examples"].([]any); ok && isSchemaLike(v) {
		delete(out, "examples")
		if len(ex) > 0 {
			out["example"] = ex[0]
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		alts, ok := out[k].([]any)
		if !ok {
			continue
		}
		var kept []any
		nullable := false
		for _, a := range alts {
			// {"type": "null"}, converted already to {"nullable": true}
			if m, ok := a.(map[string]any); ok && len(m) == 1 && (m["type"] == "null" || m["nullable"] == true) {
				nullable = true
				continue
			}
			kept = append(kept, a)
		}
		if !nullable {
			continue
		}
		if len(kept) != 1 {
			out[k] = kept
			out["nullable"] = true
			continue
		}
		delete(out, k)
		one, _ := kept[0].(map[string]any)
		if _, isRef := one["$ref"]; isRef {
			if len(out) == 0 || onlyDocs(out) {
				return one // a bare $ref: 3.0 ignores what stands beside one
			}
			out["allOf"] = []any{one}
			out["nullable"] = true
			continue
		}
		for kk, vv := range one {
			if _, has := out[kk]; !has {
				out[kk] = vv
			}
		}
		out["nullable"] = true
	}
	return out
}

// deep reports whether ref points inside a component rather than at one.
func deep(ref string) bool {
	return strings.HasPrefix(ref, "#/") && strings.Count(ref, "/") > 3
}

// resolve finds the local reference ref in the document.
func (c *converter) resolve(ref string) (any, error) {
	var cur any = c.root
	for _, tok := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("reference %s: %q is not inside an object", ref, tok)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("reference %s: no %q", ref, tok)
		}
	}
	return cur, nil
}

// isSchemaLike reports whether m reads as a schema (whose "examples" is a
// list), not a media type or parameter (whose "examples" is a map).
func isSchemaLike(m map[string]any) bool {
	_, list := m["examples"].([]any)
	return list
}

// onlyDocs reports whether m holds only documentation keywords.
func onlyDocs(m map[string]any) bool {
	for k := range m {
		if k != "description" && k != "title" {
			return false
		}
	}
	return true
}

func jsonType(v any) string {
	switch x := v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64:
		if x == float64(int64(x)) {
			return "integer"
		}
		return "number"
	}
	return ""
}
