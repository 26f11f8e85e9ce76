package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/httpapi/benchpeer"
)

// wrkScript sets up a row's request in wrk and prints its results.
//
//go:embed wrk.lua
var wrkScript []byte

// wrkDriver drives closed-loop rows with wrk (Debian's package): a C event
// loop per thread, which spends less CPU per request than loadgen's own
// goroutines, and so leaves more of the machine's cores to the servers
// measured. wrk runs for whole seconds, and knows no -max.
type wrkDriver struct {
	path    string // the wrk binary
	threads int
	dir     string // wrk.lua, and the rows' body and key files
	files   int    // files written so far, to name the next
}

// newWrkDriver writes wrk.lua into a new temporary directory, which
// close removes.
func newWrkDriver(path string, threads int) (*wrkDriver, error) {
	dir, err := os.MkdirTemp("", "loadgen-wrk-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "wrk.lua"), wrkScript, 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &wrkDriver{path: path, threads: threads, dir: dir}, nil
}

func (w *wrkDriver) close() error { return os.RemoveAll(w.dir) }

func (w *wrkDriver) String() string { return fmt.Sprintf("wrk (%s, %d threads)", w.path, w.threads) }

// file writes content to a new file of w's directory and returns its path.
func (w *wrkDriver) file(content []byte) (string, error) {
	w.files++
	p := filepath.Join(w.dir, "row"+strconv.Itoa(w.files))
	return p, os.WriteFile(p, content, 0o600)
}

// wrkSeconds is how long wrk runs for d: whole seconds (its -d takes no
// fraction), at least one.
func wrkSeconds(d time.Duration) int {
	return max(1, int(d.Round(time.Second)/time.Second))
}

// args returns wrk's command line and environment for t.
func (w *wrkDriver) args(t *target, d time.Duration, conns int) (args, env []string, err error) {
	threads := min(w.threads, conns) // wrk wants at least a connection per thread
	args = []string{"-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns), "-d", strconv.Itoa(wrkSeconds(d)) + "s",
		"--timeout", "10s", "-s", filepath.Join(w.dir, "wrk.lua")}
	if t.auth != "" {
		args = append(args, "-H", "Authorization: "+t.auth)
	}
	env = append(os.Environ(), "LOADGEN_METHOD="+t.method, "LOADGEN_THREADS="+strconv.Itoa(threads))
	if t.body != nil {
		p, err := w.file(t.body)
		if err != nil {
			return nil, nil, err
		}
		env = append(env, "LOADGEN_BODY_FILE="+p)
	}
	if len(t.keys) > 0 {
		p, err := w.file([]byte(strings.Join(t.keys, "\n") + "\n"))
		if err != nil {
			return nil, nil, err
		}
		env = append(env, "LOADGEN_KEYS_FILE="+p, "LOADGEN_KEY_HEADER="+benchpeer.KeyHeader)
	}
	return append(args, t.uri), env, nil
}

// closedLoop runs wrk against t for d (in whole seconds) and returns
// what it measured. An error means wrk could not run or said nothing
// readable; failed requests are in the Result.
func (w *wrkDriver) closedLoop(ctx context.Context, t *target, d time.Duration, conns int) (Result, error) {
	args, env, err := w.args(t, d, conns)
	if err != nil {
		return Result{}, err
	}
	// wrk stops itself after -d; the deadline is for a wrk that hangs.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(wrkSeconds(d))*time.Second+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, w.path, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	s, err := parseWrk(stdout.String())
	if runErr != nil || err != nil {
		return Result{}, fmt.Errorf("%s: wrk %s: %w (stderr: %.500s; stdout: %.500s)", t.row, strings.Join(args, " "),
			errors.Join(runErr, err), strings.TrimSpace(stderr.String()), strings.TrimSpace(stdout.String()))
	}
	return s.result(t), nil
}

// wrkSummary is the line wrk.lua prints when wrk is done.
type wrkSummary struct {
	requests, durationUS, p50US, p99US int64
	connect, read, write, status       int64 // errors; status: answers ≥ 400
	timeout                            int64
}

// parseWrk finds wrk.lua's line in wrk's output and reads it.
func parseWrk(out string) (wrkSummary, error) {
	var s wrkSummary
	for line := range strings.Lines(out) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "loadgen-wrk ")
		if !ok {
			continue
		}
		fields := map[string]*int64{"requests": &s.requests, "duration_us": &s.durationUS, "p50_us": &s.p50US,
			"p99_us": &s.p99US, "connect": &s.connect, "read": &s.read, "write": &s.write, "status": &s.status, "timeout": &s.timeout}
		for f := range strings.FieldsSeq(rest) {
			k, v, _ := strings.Cut(f, "=")
			dst, ok := fields[k]
			if !ok {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return s, fmt.Errorf("wrk.lua's line %q: %s=%q is not a count", rest, k, v)
			}
			*dst = n
			delete(fields, k)
		}
		if len(fields) > 0 {
			var missing []string
			for k := range fields {
				missing = append(missing, k)
			}
			return s, fmt.Errorf("wrk.lua's line %q lacks %s", rest, strings.Join(missing, ", "))
		}
		if s.durationUS <= 0 {
			return s, fmt.Errorf("wrk.lua's line %q: no duration", rest)
		}
		return s, nil
	}
	return s, errors.New("no loadgen-wrk line in wrk's output")
}

// result turns s into t's row. wrk tells answers with a status ≥ 400
// apart from the others, not which status they had: for a target that
// wants a status ≥ 400 (the deny cache's 429), those are its successes
// and the others its errors; for a target that counts a refusal apart,
// they are its refusals; else they are errors. Requests that got no
// answer (connect, read, write, timeout) are errors.
func (s wrkSummary) result(t *target) Result {
	unanswered := s.connect + s.read + s.write + s.timeout
	r := Result{Row: t.row, Requests: s.requests + unanswered, Errors: unanswered,
		RPS: float64(s.requests) / (float64(s.durationUS) / 1e6),
		P50: time.Duration(s.p50US) * time.Microsecond, P99: time.Duration(s.p99US) * time.Microsecond}
	switch {
	case t.want >= 400:
		r.Errors += s.requests - s.status
		if s.requests > s.status {
			r.FirstErr = fmt.Sprintf("%d answers with a status below 400, want %d", s.requests-s.status, t.want)
		}
	case t.refuse != 0:
		r.Refused = s.status
	default:
		r.Errors += s.status
		if s.status > 0 {
			r.FirstErr = fmt.Sprintf("%d answers with a status of 400 or more, want %d", s.status, t.want)
		}
	}
	if unanswered > 0 && r.FirstErr == "" {
		r.FirstErr = fmt.Sprintf("no answer: connect %d, read %d, write %d, timeout %d", s.connect, s.read, s.write, s.timeout)
	}
	r.OK = r.Requests - r.Errors - r.Refused
	return r
}
