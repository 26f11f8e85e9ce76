package config

import (
	"os"
	"path/filepath"
	"regexp"
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

// TestREADMELinksStayInTheRepository: every relative link of the README
// names a file of the repository, and every #anchor one of its headings;
// nothing links outside the repository (a clone has nothing beside it).
func TestREADMELinksStayInTheRepository(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(readme, -1) {
		a := strings.ToLower(strings.TrimSpace(m[1]))
		a = regexp.MustCompile("[^a-z0-9 _-]").ReplaceAllString(a, "")
		anchors[strings.ReplaceAll(a, " ", "-")] = true
	}
	links := regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(readme, -1)
	if len(links) == 0 {
		t.Fatal("no links found in README.md: the pattern is wrong")
	}
	for _, m := range links {
		target := m[1]
		switch {
		case strings.HasPrefix(target, "http://"), strings.HasPrefix(target, "https://"), strings.HasPrefix(target, "mailto:"):
		case strings.HasPrefix(target, "#"):
			if !anchors[target[1:]] {
				t.Errorf("README links to %s: no such heading", target)
			}
		default:
			path, _, _ := strings.Cut(target, "#")
			clean := filepath.Clean(path) // relative to the repository's root
			if clean == ".." || strings.HasPrefix(clean, "../") || filepath.IsAbs(clean) {
				t.Errorf("README links to %s, outside the repository", target)
				continue
			}
			if _, err := os.Stat(filepath.Join("../..", clean)); err != nil {
				t.Errorf("README links to %s: %v", target, err)
			}
		}
	}
}
