package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

const howToBrowser = "run `make test`, which installs Debian's chromium package when no browser is found, " +
	"or install one (apt-get install chromium) or set TOLLGATE_CHROMIUM to a Chromium or Chrome binary"

// ChromiumPath returns the browser the dashboard tests drive: TOLLGATE_CHROMIUM,
// else the first of chromium, chromium-browser, google-chrome on PATH. With
// none, the test fails saying how to get one: browser tests never skip.
func ChromiumPath(tb testing.TB) string {
	tb.Helper()
	Integration(tb, "a headless Chromium")
	if p := os.Getenv("TOLLGATE_CHROMIUM"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			tb.Fatalf("testenv: TOLLGATE_CHROMIUM=%s: %v: %s", p, err, howToBrowser)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	tb.Fatalf("testenv: no Chromium or Chrome found: %s", howToBrowser)
	return ""
}

// Browser starts a headless Chromium of the test's own (a fresh profile, so
// no cookie is shared with another test) with a window of width × height
// CSS pixels, and returns a chromedp context for it, with a deadline. The
// browser is closed at cleanup. It reaches no network: the tests serve
// everything on loopback, and background networking is off.
func Browser(tb testing.TB, width, height int) context.Context {
	tb.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(ChromiumPath(tb)),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.NoSandbox, // tests may run as root, where Chromium's sandbox cannot start
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.WindowSize(width, height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelCtx := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	tb.Cleanup(func() {
		cancelTimeout()
		cancelCtx()
		cancelAlloc()
	})
	// Start the browser now, so that a browser that cannot start fails here
	// with a clear message rather than in the test's first step.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		tb.Fatalf("testenv: start Chromium: %v: %s", err, howToBrowser)
	}
	// Headless windows have a minimum width; the viewport has none, so a
	// phone's width is emulated.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		tb.Fatalf("testenv: viewport: %v", err)
	}
	return ctx
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// Screenshot saves a PNG of the whole page under .artifacts/screenshots/ at
// the repository's root (ignored by git), named after the test and name,
// and returns its path.
func Screenshot(tb testing.TB, ctx context.Context, name string) string {
	tb.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.Fatalf("testenv: screenshot: %v", err)
	}
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		tb.Fatalf("testenv: screenshot is not a PNG (%d bytes)", len(png))
	}
	dir := filepath.Join(repoRoot(tb), ".artifacts", "screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	file := unsafeName.ReplaceAllString(tb.Name(), "_")
	if name != "" {
		file += "-" + unsafeName.ReplaceAllString(name, "_")
	}
	path := filepath.Join(dir, file+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Logf("screenshot: %s", path)
	return path
}

// repoRoot is the nearest directory at or above the working directory that
// holds go.mod.
func repoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("testenv: no go.mod at or above the working directory")
		}
		dir = parent
	}
}
