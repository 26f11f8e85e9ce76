package arch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pkg is what the rules read of `go list -json`: the non-test Go files
// (GoFiles) and their imports (Imports; test imports are listed apart, as
// TestImports and XTestImports, and are not read).
type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
	Error      *struct{ Err string }
}

// module is the module's packages, keyed by import path relative to the
// module ("internal/quota", "cmd/api").
type module struct {
	path string
	pkgs map[string]*pkg
}

// The packages the rules name, relative to the module.
const (
	domain    = "internal/quota"
	httpLayer = "internal/httpapi"
	envoy     = "internal/envoy"
	admission = "internal/admission"
	startUp   = "internal/app"
	e2e       = "internal/e2e"
	redisSide = "internal/redisfn"
	redisJoin = "internal/quotaredis"
)

var (
	// adapters are the adapters other than the HTTP layer, which is
	// httpLayer and every package under it.
	adapters = []string{redisSide, "internal/pgdb", "internal/catalogdb", "internal/redisdb"}
	// redisParts are the Redis side of quota state, which counts as one
	// adapter (redisSide): the parts, each on the store of internal/redisfn,
	// and internal/quotaredis, which joins them.
	redisParts   = []string{"internal/ratelimit", "internal/pending", "internal/settlement", "internal/idempotency"}
	redisSideAll = append([]string{redisSide, redisJoin}, redisParts...)
	services     = []string{"internal/admission", "internal/billing", "internal/catalog",
		"internal/usage", "internal/worker", "internal/locallimit", "internal/policyalg", "internal/limits",
		"internal/stripeexport"}
	// quotaState are the packages that keep or decide quota state behind
	// the admission use case, which the HTTP layer and envoy do not import.
	quotaState = append([]string{"internal/redisdb", "internal/limits", "internal/policyalg"}, redisSideAll...)
	// mains are the binaries whose start-up is startUp's, each with the
	// only packages of the module it may import.
	mains = map[string][]string{
		"cmd/api":    {startUp, "internal/config"}, // config: `api -healthcheck` reads TOLLGATE_ADDR
		"cmd/worker": {startUp},
	}
	// e2eSuites are the end-to-end test packages under e2e.
	e2eSuites = []string{e2e + "/api", e2e + "/worker"}
	// testOnly are the packages no product code imports: the tests' helpers
	// and suites, and this one.
	testOnly = []string{"internal/testenv", "internal/quotaredis/quotaredistest", e2e, "internal/arch"}
)

func TestArchitecture(t *testing.T) {
	m := mustLoad(t)

	t.Run("domain imports nothing of ours, Redis, Postgres or HTTP", func(t *testing.T) {
		m.mustExist(t, domain)
		forbidden := []string{"github.com/redis/", "github.com/jackc/", "github.com/golang-migrate/",
			"github.com/gofiber/", "github.com/valyala/", "net/http"}
		for _, imp := range m.imports(domain) {
			if rel, ours := m.rel(imp); ours {
				t.Errorf("%s imports %s: the domain imports no package of this module", domain, rel)
				continue
			}
			for _, f := range forbidden {
				if under(imp, f) {
					t.Errorf("%s imports %s: the domain imports nothing of Redis, Postgres or HTTP (%s)", domain, imp, f)
				}
			}
		}
	})

	t.Run("adapters do not import one another", func(t *testing.T) {
		m.mustExist(t, append([]string{httpLayer}, adapters...)...)
		for _, p := range m.sorted() {
			from := adapterOf(p)
			if from == "" {
				continue
			}
			for _, imp := range m.imports(p) {
				rel, ours := m.rel(imp)
				if to := adapterOf(rel); ours && to != "" && to != from {
					t.Errorf("%s imports %s: adapter %s must not import adapter %s", p, rel, from, to)
				}
			}
		}
	})

	t.Run("only the HTTP layer imports Fiber", func(t *testing.T) {
		m.mustExist(t, httpLayer)
		for _, p := range m.sorted() {
			if under(p, httpLayer) {
				continue
			}
			for _, imp := range m.imports(p) {
				if under(imp, "github.com/gofiber") {
					t.Errorf("%s imports %s: only %s and the packages under it may import Fiber", p, imp, httpLayer)
				}
			}
		}
	})

	t.Run("no package holds more than a quarter of the lines", func(t *testing.T) {
		type count struct {
			pkg   string
			lines int
		}
		var counts []count
		total := 0
		for _, p := range m.sorted() {
			if !under(p, "cmd") && !under(p, "internal") {
				continue
			}
			n, err := goLines(m.pkgs[p])
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			counts = append(counts, count{p, n})
			total += n
		}
		if total == 0 {
			t.Fatal("no Go lines under cmd/ and internal/: the count read nothing")
		}
		slices.SortStableFunc(counts, func(a, b count) int { return b.lines - a.lines })
		var table strings.Builder
		fmt.Fprintf(&table, "non-test Go lines per package (limit %d, a quarter of %d):\n", total/4, total)
		for _, c := range counts {
			fmt.Fprintf(&table, "  %-36s %6d  %5.1f%%\n", c.pkg, c.lines, 100*float64(c.lines)/float64(total))
		}
		t.Log(table.String())
		for _, c := range counts {
			if 4*c.lines > total {
				t.Errorf("%s holds %d of %d non-test Go lines (%.1f%%), more than a quarter\n%s",
					c.pkg, c.lines, total, 100*float64(c.lines)/float64(total), table.String())
			}
		}
	})

	t.Run("the HTTP layer and envoy decide through the admission use case", func(t *testing.T) {
		m.mustExist(t, httpLayer, envoy, admission)
		m.mustExist(t, quotaState...)
		if !slices.Contains(m.imports(httpLayer), m.path+"/"+admission) {
			t.Errorf("%s does not import %s: its metered route and decision API admit through the admission use case", httpLayer, admission)
		}
		for _, p := range m.sorted() {
			if !under(p, httpLayer) && !under(p, envoy) {
				continue
			}
			for _, imp := range m.imports(p) {
				rel, ours := m.rel(imp)
				if !ours {
					continue
				}
				for _, q := range quotaState {
					if under(rel, q) {
						t.Errorf("%s imports %s: the HTTP layer and %s reach quota state through %s only", p, rel, envoy, admission)
					}
				}
			}
		}
	})

	t.Run("services do not import the Redis side, the Postgres adapters or the HTTP layer", func(t *testing.T) {
		m.mustExist(t, services...)
		m.mustExist(t, "internal/pgdb", "internal/catalogdb", httpLayer)
		m.mustExist(t, redisSideAll...)
		for _, s := range services {
			for _, imp := range m.imports(s) {
				rel, ours := m.rel(imp)
				if ours && (adapterOf(rel) == redisSide || under(rel, "internal/pgdb") || under(rel, "internal/catalogdb") || under(rel, httpLayer)) {
					t.Errorf("%s imports %s: a service does not import the Redis side (%s), internal/pgdb, internal/catalogdb or %s (%s wires them in)",
						s, rel, strings.Join(redisSideAll, ", "), httpLayer, startUp)
				}
			}
		}
	})

	t.Run("the mains import only the start-up, which only they import", func(t *testing.T) {
		m.mustExist(t, startUp)
		for main, allowed := range mains {
			m.mustExist(t, main)
			for _, imp := range m.imports(main) {
				if rel, ours := m.rel(imp); ours && !slices.Contains(allowed, rel) {
					t.Errorf("%s imports %s: a main imports only %v; its wiring belongs in %s", main, rel, allowed, startUp)
				}
			}
		}
		for _, p := range m.sorted() {
			if _, isMain := mains[p]; isMain {
				continue
			}
			for _, imp := range m.imports(p) {
				if rel, ours := m.rel(imp); ours && under(rel, startUp) {
					t.Errorf("%s imports %s: only the mains (%s) import the start-up", p, rel, strings.Join(slices.Sorted(maps.Keys(mains)), ", "))
				}
			}
		}
	})

	t.Run("the start-up imports no test package", func(t *testing.T) {
		m.mustExist(t, startUp, "internal/testenv", "internal/arch")
		m.mustExist(t, e2eSuites...)
		for _, imp := range m.imports(startUp) {
			rel, ours := m.rel(imp)
			if !ours {
				continue
			}
			if under(rel, "cmd") {
				t.Errorf("%s imports %s: the start-up imports no binary", startUp, rel)
			}
			for _, tp := range testOnly {
				if under(rel, tp) {
					t.Errorf("%s imports %s: the start-up imports none of %v", startUp, rel, testOnly)
				}
			}
		}
	})

	t.Run("the end-to-end suites hold tests only", func(t *testing.T) {
		m.mustExist(t, e2eSuites...)
		for _, p := range m.sorted() {
			if !under(p, e2e) {
				continue
			}
			if !slices.Contains(e2eSuites, p) {
				t.Errorf("%s: a package under %s that the rules do not list in e2eSuites", p, e2e)
			}
			if files := m.pkgs[p].GoFiles; len(files) > 1 || len(files) == 1 && files[0] != "doc.go" {
				t.Errorf("%s has non-test files %v: an end-to-end suite holds its package doc (doc.go) and tests only", p, files)
			}
			if imps := m.imports(p); len(imps) > 0 {
				t.Errorf("%s imports %v outside its tests: an end-to-end suite holds tests only", p, imps)
			}
		}
		for _, p := range m.sorted() {
			for _, imp := range m.imports(p) {
				if rel, ours := m.rel(imp); ours && under(rel, e2e) {
					t.Errorf("%s imports %s: no package imports an end-to-end suite", p, rel)
				}
			}
		}
	})

	t.Run("the Redis parts share only internal/redisfn", func(t *testing.T) {
		m.mustExist(t, redisSideAll...)
		for _, p := range append([]string{redisSide}, redisParts...) {
			for _, imp := range m.imports(p) {
				rel, ours := m.rel(imp)
				if !ours || under(rel, redisSide) {
					continue
				}
				if slices.ContainsFunc(redisSideAll, func(q string) bool { return under(rel, q) }) {
					t.Errorf("%s imports %s: the parts of the Redis side import %s only, and %s none of them (%s joins them)",
						p, rel, redisSide, redisSide, redisJoin)
				}
			}
		}
	})
}

// adapterOf returns the adapter a module-relative package belongs to
// (httpLayer for every package under it), or "" for none.
func adapterOf(rel string) string {
	if under(rel, httpLayer) {
		return httpLayer
	}
	for _, q := range redisSideAll {
		if under(rel, q) {
			return redisSide
		}
	}
	for _, a := range adapters {
		if under(rel, a) {
			return a
		}
	}
	return ""
}

// under reports whether import path p is prefix or a package below it; a
// prefix ending in "/" matches any path that starts with it.
func under(p, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(p, prefix)
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

// rel returns imp relative to the module, and whether it is of the module.
func (m *module) rel(imp string) (string, bool) {
	if imp == m.path {
		return ".", true
	}
	rel, ok := strings.CutPrefix(imp, m.path+"/")
	return rel, ok
}

func (m *module) imports(rel string) []string {
	if p := m.pkgs[rel]; p != nil {
		return p.Imports
	}
	return nil
}

func (m *module) sorted() []string {
	var rels []string
	for rel := range m.pkgs {
		rels = append(rels, rel)
	}
	slices.Sort(rels)
	return rels
}

// mustExist fails t for each of rels that is not a package of the module: a
// rule about a package that was renamed or removed would otherwise pass on
// nothing.
func (m *module) mustExist(tb testing.TB, rels ...string) {
	tb.Helper()
	for _, rel := range rels {
		if m.pkgs[rel] == nil {
			tb.Errorf("package %s/%s does not exist: the rule names it, so update the rule with the rename", m.path, rel)
		}
	}
}

// mustLoad lists the module's packages with `go list -json ./...`, run at the
// module root. A package go list could not load fails the test: its imports
// would be incomplete, and the rules would read a partial graph.
func mustLoad(tb testing.TB) *module {
	tb.Helper()
	root, modPath, err := moduleRoot()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-e", "-deps=false", "-json=ImportPath,Dir,GoFiles,Imports,Error", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("go list in %s: %v\n%s", root, err, stderr.Bytes())
	}
	m := &module{path: modPath, pkgs: map[string]*pkg{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			tb.Fatalf("go list output: %v", err)
		}
		rel, ours := m.rel(p.ImportPath)
		if !ours {
			tb.Fatalf("go list ./... listed %s, outside module %s", p.ImportPath, modPath)
		}
		if p.Error != nil {
			tb.Errorf("go list: package %s: %s (the rules read its imports as far as go list got)", rel, p.Error.Err)
		}
		m.pkgs[rel] = &p
	}
	if len(m.pkgs) == 0 {
		tb.Fatalf("go list ./... in %s listed no package", root)
	}
	return m
}

// moduleRoot walks up from the working directory to the directory holding
// go.mod, and returns it with the module path go.mod declares.
func moduleRoot() (dir, modPath string, err error) {
	dir, err = os.Getwd()
	if err != nil {
		return "", "", err
	}
	for {
		f, err := os.Open(filepath.Join(dir, "go.mod"))
		if err == nil {
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
					return dir, strings.Trim(strings.TrimSpace(rest), `"`), nil
				}
			}
			if err := sc.Err(); err != nil {
				return "", "", err
			}
			return "", "", fmt.Errorf("%s/go.mod declares no module", dir)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// goLines counts the lines of p's non-test Go files.
func goLines(p *pkg) (int, error) {
	n := 0
	for _, f := range p.GoFiles {
		b, err := os.ReadFile(filepath.Join(p.Dir, f))
		if err != nil {
			return 0, err
		}
		n += bytes.Count(b, []byte("\n"))
		if len(b) > 0 && b[len(b)-1] != '\n' {
			n++
		}
	}
	return n, nil
}
