package config

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEListsEveryVariable keeps the README's configuration table true.
func TestREADMEListsEveryVariable(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	for _, v := range Vars {
		def := "(none)"
		if v.Default != "" {
			def = "`" + v.Default + "`"
		}
		row := "| `" + v.Name + "` | " + def + " |"
		if !strings.Contains(readme, row) {
			t.Errorf("README.md lacks the row starting %q", row)
		}
	}
}
