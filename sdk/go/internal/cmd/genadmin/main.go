// Command genadmin generates the SDK's admin client: it rewrites Tollgate's
// OpenAPI 3.1 document to 3.0 (internal/oas30) into a temporary file and
// runs oapi-codegen, pinned as a tool of this module, on it. Run it from
// sdk/go/admin (go generate) or give every path.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/tollgate/tollgate/sdk/go/internal/oas30"
)

func main() {
	spec := flag.String("spec", "../../../internal/httpapi/openapi.json", "the OpenAPI 3.1 document")
	config := flag.String("config", "oapi-codegen.yaml", "oapi-codegen's configuration")
	out := flag.String("o", "admin.gen.go", "the Go file to write")
	flag.Parse()
	if err := run(*spec, *config, *out); err != nil {
		fmt.Fprintln(os.Stderr, "genadmin:", err)
		os.Exit(1)
	}
}

func run(spec, config, out string) (err error) {
	doc, err := os.ReadFile(filepath.Clean(spec))
	if err != nil {
		return err
	}
	conv, err := oas30.Convert(doc)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "genadmin-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	tmp := filepath.Join(dir, "openapi-3.0.json")
	if err := os.WriteFile(tmp, conv, 0o600); err != nil {
		return err
	}
	cfg, err := filepath.Abs(config)
	if err != nil {
		return err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("go", "tool", "oapi-codegen", "-config", cfg, tmp)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("oapi-codegen: %w: %s", err, stderr.Bytes())
	}
	return os.WriteFile(out, stdout.Bytes(), 0o600)
}
