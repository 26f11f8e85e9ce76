package admin_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedClientIsCurrent regenerates the client from the served
// OpenAPI document into a temporary folder: admin.gen.go must be what it
// gives (run `make generate` at the repository's root otherwise).
func TestGeneratedClientIsCurrent(t *testing.T) {
	out := filepath.Join(t.TempDir(), "admin.gen.go")
	cmd := exec.Command("go", "run", "../internal/cmd/genadmin",
		"-spec", "../../../internal/httpapi/openapi.json", "-config", "oapi-codegen.yaml", "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("genadmin: %v\n%s", err, b)
	}
	fresh, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("admin.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, committed) {
		t.Fatalf("admin.gen.go is stale: the OpenAPI document or oapi-codegen.yaml changed since it was generated (%d bytes now, %d generated): run `make generate` at the repository's root", len(committed), len(fresh))
	}
}
