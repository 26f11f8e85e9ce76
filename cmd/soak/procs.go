package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one child process the soak started: a Redis, a Postgres, an api
// node or a worker. Every proc dies with the soak (Pdeathsig on Linux) and is
// stopped by stopAll on every way out.
type proc struct {
	name string
	argv []string
	env  []string
	log  string // file its stdout and stderr go to
	cred *syscall.Credential

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when cmd exits
	started time.Time
}

// start runs the process; it does not wait for it to be ready.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = procAttr()
	if p.cred != nil {
		cmd.SysProcAttr.Credential = p.cred
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}()
	p.cmd, p.done, p.started = cmd, done, time.Now()
	return nil
}

// pid is the running process's id, 0 when none runs.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	select {
	case <-p.done:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// wait waits up to d for the process to exit; false when it still runs.
func (p *proc) wait(d time.Duration) bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// stop asks the process to stop with sig, and kills it after grace.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p.pid() == 0 {
		return
	}
	_ = p.signal(syscall.SIGCONT) // a paused Redis cannot stop
	_ = p.signal(sig)
	if !p.wait(grace) {
		_ = p.signal(syscall.SIGKILL)
		p.wait(5 * time.Second)
	}
}

// kill ends the process with SIGKILL and waits for it.
func (p *proc) kill() {
	if p.pid() == 0 {
		return
	}
	_ = p.signal(syscall.SIGKILL)
	p.wait(10 * time.Second)
}

// freePort is a loopback port nothing listened on a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitFor calls ready every 100 ms until it succeeds, p exits or d passes.
func waitFor(ctx context.Context, p *proc, d time.Duration, ready func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if p != nil && p.pid() == 0 {
			return fmt.Errorf("%s exited before it was ready (see %s): %w", p.name, p.log, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s (see %s): %w", p.name, d, p.log, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// httpOK is nil once GET url answers 200.
func httpOK(url string) func() error {
	return func() error {
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %d", url, resp.StatusCode)
		}
		return nil
	}
}

// newRedis is a redis-server on a loopback port with append-only
// persistence in dir, so that a restart loses nothing.
func newRedis(dir string, port int) *proc {
	return &proc{
		name: "redis",
		argv: []string{"redis-server", "--bind", "127.0.0.1", "--port", strconv.Itoa(port),
			"--dir", dir, "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
			"--protected-mode", "yes", "--loglevel", "warning"},
		env: os.Environ(),
		log: filepath.Join(dir, "redis.log"),
	}
}

// pgBin finds the directory of initdb and postgres: PATH first, then
// Debian's /usr/lib/postgresql/<version>/bin, the newest.
func pgBin() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	best, bestV := "", -1
	for _, d := range dirs {
		v, err := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil && v > bestV {
			best, bestV = d, v
		}
	}
	if best == "" {
		return "", errors.New("no initdb on PATH nor in /usr/lib/postgresql/*/bin: install postgresql (apt-get install postgresql)")
	}
	return best, nil
}

// pgCredential is the postgres user's when the soak runs as root (initdb
// and postgres refuse root), nil otherwise.
func pgCredential() (*syscall.Credential, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user to own the soak's cluster: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("the postgres user's uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("the postgres user's gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// newPostgres makes a fresh cluster in dir (initdb, trust on loopback) and
// returns the postmaster as a proc on port.
func newPostgres(ctx context.Context, dir string, port int) (*proc, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	cred, err := pgCredential()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "-E", "UTF8", "--no-locale")
	initdb.Dir = "/"
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb %s: %w: %s", data, err, strings.TrimSpace(string(out)))
	}
	log := filepath.Join(dir, "postgres.log")
	if f, err := os.Create(log); err == nil {
		f.Close()
	}
	return &proc{
		name: "postgres",
		argv: []string{filepath.Join(bin, "postgres"), "-D", data, "-h", "127.0.0.1", "-p", strconv.Itoa(port),
			"-k", dir, "-c", "fsync=off", "-c", "max_connections=200"},
		env:  os.Environ(),
		log:  log,
		cred: cred,
	}, nil
}
