package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// configurationPage is the home of the configuration table.
const configurationPage = "docs/operations/configuration.md"

// TestREADMEListsEveryVariable keeps the configuration table of the
// operator's documentation true: every variable the code reads (Vars) has
// a row with its default, and every row of the table is such a variable,
// once. The README points to the table and holds no copy of it.
func TestREADMEListsEveryVariable(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("../..", configurationPage))
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	for _, v := range Vars {
		def := "(none)"
		if v.Default != "" {
			def = "`" + v.Default + "`"
		}
		row := "| `" + v.Name + "` | " + def + " |"
		if !strings.Contains(page, row) {
			t.Errorf("%s lacks the row starting %q", configurationPage, row)
		}
	}

	rows := configurationRows(t, page)
	known := map[string]bool{}
	for _, v := range Vars {
		known[v.Name] = true
	}
	seen := map[string]bool{}
	for _, name := range rows {
		if !known[name] {
			t.Errorf("%s has a row for %s, which the code does not read (not in Vars)", configurationPage, name)
		}
		if seen[name] {
			t.Errorf("%s has two rows for %s", configurationPage, name)
		}
		seen[name] = true
	}
	if len(rows) != len(Vars) {
		t.Errorf("%s's table has %d rows; the code reads %d variables", configurationPage, len(rows), len(Vars))
	}

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(readme), "| variable | default |") {
		t.Errorf("README.md holds a configuration table: it belongs in %s alone", configurationPage)
	}
}

// configurationRows are the variable names of the rows of the one table
// whose header is "| variable | default | meaning |".
func configurationRows(t *testing.T, page string) []string {
	t.Helper()
	const header = "| variable | default | meaning |"
	lines := strings.Split(page, "\n")
	start := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == header {
			if start >= 0 {
				t.Fatalf("%s has two configuration tables", configurationPage)
			}
			start = i
		}
	}
	if start < 0 || start+1 >= len(lines) || !strings.HasPrefix(lines[start+1], "|---") {
		t.Fatalf("%s has no table headed %q", configurationPage, header)
	}
	cell := regexp.MustCompile("^\\| `([A-Z][A-Z0-9_]*)` \\| ")
	var names []string
	for _, l := range lines[start+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		m := cell.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("%s: a row of the configuration table names no variable: %q", configurationPage, l)
			continue
		}
		names = append(names, m[1])
	}
	return names
}

// TestDocsLinksStayInTheRepository: every link of the product's
// documentation (the README, every page under docs/, found by walking the
// tree, and the Go SDK's README) names a file of the repository, and every
// #anchor a heading of the page it points to; nothing links outside the
// repository (a clone has nothing beside it).
func TestDocsLinksStayInTheRepository(t *testing.T) {
	const root = "../.."
	pages := []string{"README.md", "sdk/go/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			pages = append(pages, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{configurationPage, "docs/architecture.md"} {
		found := false
		for _, p := range pages {
			found = found || p == want
		}
		if !found {
			t.Fatalf("the walk found %v, not %s: the walk is wrong", pages, want)
		}
	}
	linkRe := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	total := 0
	for _, page := range pages {
		raw, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRe.FindAllStringSubmatch(proseOf(string(raw)), -1) {
			total++
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "//") {
				t.Errorf("%s links to %s, outside the repository", page, target)
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.ToSlash(filepath.Join(filepath.Dir(page), path))
				if file == ".." || strings.HasPrefix(file, "../") || filepath.IsAbs(path) {
					t.Errorf("%s links to %s, outside the repository", page, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, file)); err != nil {
					t.Errorf("%s links to %s: %v", page, target, err)
					continue
				}
			}
			if anchor != "" {
				if !strings.HasSuffix(file, ".md") {
					t.Errorf("%s links to %s: an anchor into a file that is not a page", page, target)
					continue
				}
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

// proseOf is a page without its fenced code blocks, whose lines are
// neither headings nor links.
func proseOf(page string) string {
	var b strings.Builder
	fence := ""
	for _, l := range strings.SplitAfter(page, "\n") {
		trimmed := strings.TrimSpace(l)
		if fence == "" && (strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~")) {
			fence = trimmed[:3]
			continue
		}
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		b.WriteString(l)
	}
	return b.String()
}

// headingAnchors are the anchors a Markdown renderer gives the headings of
// a page: lower case, punctuation dropped, spaces as dashes, and a second
// heading of the same text suffixed -1, a third -2.
func headingAnchors(page string) map[string]bool {
	anchors := map[string]bool{}
	count := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(proseOf(page), -1) {
		a := strings.ToLower(strings.TrimSpace(m[1]))
		a = regexp.MustCompile("[^a-z0-9 _-]").ReplaceAllString(a, "")
		a = strings.ReplaceAll(a, " ", "-")
		if n := count[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		count[a]++
	}
	return anchors
}
