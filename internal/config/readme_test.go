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

// TestDocsLinksStayInTheRepository: every relative link of the product's
// documentation (the README, docs/ and the Go SDK's README) names a file
// of the repository, and every #anchor a heading of the page it points
// to; nothing links outside the repository (a clone has nothing beside
// it).
func TestDocsLinksStayInTheRepository(t *testing.T) {
	const root = "../.."
	pages := []string{"README.md", "sdk/go/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			pages = append(pages, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 3 {
		t.Fatalf("found only %v: the walk is wrong", pages)
	}
	linkRe := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	total := 0
	for _, page := range pages {
		raw, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRe.FindAllStringSubmatch(string(raw), -1) {
			total++
			target := m[1]
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
				if file == ".." || strings.HasPrefix(file, "../") || filepath.IsAbs(path) {
					t.Errorf("%s links to %s, outside the repository", page, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s links to %s: %v", page, target, err)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(file, ".md") {
				body, err := os.ReadFile(filepath.Join(root, file))
				if err != nil {
					t.Fatal(err)
				}
				if !headingAnchors(string(body))[anchor] {
					t.Errorf("%s links to %s: %s has no such heading", page, target, file)
				}
			}
		}
	}
	if total == 0 {
		t.Fatal("no links found: the pattern is wrong")
	}
}

// headingAnchors are the anchors a Markdown renderer gives the headings of
// a page: lower case, punctuation dropped, spaces as dashes.
func headingAnchors(page string) map[string]bool {
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(page, -1) {
		a := strings.ToLower(strings.TrimSpace(m[1]))
		a = regexp.MustCompile("[^a-z0-9 _-]").ReplaceAllString(a, "")
		anchors[strings.ReplaceAll(a, " ", "-")] = true
	}
	return anchors
}
