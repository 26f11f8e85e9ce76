package oas30

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

func convertSchemas(t *testing.T, schemas string) map[string]any {
	t.Helper()
	out, err := Convert([]byte(`{"openapi": "3.1.0", "info": {"title": "t", "version": "1", "license": {"name": "MIT", "identifier": "MIT"}},
		"jsonSchemaDialect": "x", "paths": {}, "components": {"schemas": ` + schemas + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if doc["openapi"] != "3.0.3" || doc["jsonSchemaDialect"] != nil {
		t.Fatalf("openapi %v dialect %v, want 3.0.3 and none", doc["openapi"], doc["jsonSchemaDialect"])
	}
	if lic := doc["info"].(map[string]any)["license"].(map[string]any); lic["identifier"] != nil {
		t.Fatalf("license %v: want no identifier", lic)
	}
	return doc["components"].(map[string]any)["schemas"].(map[string]any)
}

func TestConvert(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"nullable type", `{"type": ["integer", "null"], "format": "int64"}`, `{"type": "integer", "format": "int64", "nullable": true}`},
		{"null alone", `{"type": "null", "description": "d"}`, `{"description": "d", "nullable": true}`},
		{"plain type", `{"type": "string"}`, `{"type": "string"}`},
		{"const", `{"const": "ok"}`, `{"type": "string", "enum": ["ok"]}`},
		{"typed const", `{"type": "boolean", "const": true}`, `{"type": "boolean", "enum": [true]}`},
		{"examples", `{"type": "string", "examples": ["a", "b"]}`, `{"type": "string", "example": "a"}`},
		{"ref or null", `{"oneOf": [{"$ref": "#/components/schemas/B"}, {"type": "null"}], "description": "d"}`, `{"$ref": "#/components/schemas/B"}`},
		{"object or null", `{"description": "d", "oneOf": [{"type": "object"}, {"type": "null"}]}`, `{"description": "d", "type": "object", "nullable": true}`},
		{"deep ref or null", `{"anyOf": [{"$ref": "#/components/schemas/B/properties/n"}, {"type": "null"}]}`, `{"type": "integer", "minimum": 1, "nullable": true}`},
		{"two alternatives", `{"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]}`, `{"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}]}`},
		{"dropped", `{"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": false, "contentMediaType": "text/html"}`, `{"type": "object"}`},
		{"property named like a keyword", `{"type": "object", "properties": {"const": {"type": ["string", "null"]}, "examples": {"type": "string"}}}`,
			`{"type": "object", "properties": {"const": {"type": "string", "nullable": true}, "examples": {"type": "string"}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := convertSchemas(t, `{"A": `+tc.in+`, "B": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}`)["A"]
			var want any
			if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				g, _ := json.Marshal(got)
				t.Fatalf("got %s, want %s", g, tc.want)
			}
		})
	}
}

func TestConvertRefusesWhatItCannot(t *testing.T) {
	for _, doc := range []string{
		`{"openapi": "3.0.3"}`,
		`not json`,
		`{"openapi": "3.1.0", "components": {"schemas": {"A": {"$ref": "#/components/schemas/B/properties/none"}, "B": {"type": "object"}}}}`,
		`{"openapi": "3.1.0", "components": {"schemas": {"A": {"$ref": "#/components/schemas/A/properties/x"}}}}`,
	} {
		if _, err := Convert([]byte(doc)); err == nil {
			t.Errorf("Convert(%s): no error", doc)
		}
	}
}

// TestConvertServedDocument holds the served document's conversion free of
// every 3.1 construct.
func TestConvertServedDocument(t *testing.T) {
	in, err := os.ReadFile("../../../../internal/httpapi/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	out, err := Convert(in)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Convert(in)
	if err != nil || string(again) != string(out) {
		t.Fatal("two conversions of one document differ")
	}
	s := string(out)
	for _, bad := range []string{`"const"`, `"type": [`, `"type": "null"`, `/properties/`, `"unevaluatedProperties"`, `"patternProperties"`, `"contentMediaType"`} {
		if strings.Contains(s, bad) {
			t.Errorf("converted document still has %s", bad)
		}
	}
}
