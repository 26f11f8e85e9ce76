package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisProcess is a redis-server of the test's own on a loopback port, which
// the test may stop and start again (outage tests). It is killed at cleanup.
type RedisProcess struct {
	URL  string
	addr string
	port int
	dir  string
	tb   testing.TB

	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartRedis starts a redis-server for the test. It fails the test, with a
// message saying what to install, when redis-server is missing.
func StartRedis(tb testing.TB) *RedisProcess {
	tb.Helper()
	Integration(tb, "redis-server")
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Fatalf("testenv: redis-server not found: install it (apt-get install redis-server); make test does")
	}
	port, err := freePort(0)
	if err != nil {
		tb.Fatal(err)
	}
	p := &RedisProcess{port: port, addr: "127.0.0.1:" + strconv.Itoa(port), dir: tb.TempDir(), tb: tb}
	p.URL = "redis://" + p.addr + "/0"
	tb.Cleanup(p.Stop)
	p.Start()
	return p
}

// Start starts the server (again) on its port and waits until it answers.
func (p *RedisProcess) Start() {
	p.tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", p.dir, "--logfile", filepath.Join(p.dir, "redis.log"))
	cmd.SysProcAttr = dieWithParent()
	if err := cmd.Start(); err != nil {
		p.tb.Fatalf("testenv: start redis-server: %v", err)
	}
	p.cmd = cmd
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := waitNode(ctx, p.addr, func(n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		p.tb.Fatalf("testenv: redis-server on %s did not answer: %v", p.addr, err)
	}
}

// Stop kills the server, as a crash would; its data is gone.
func (p *RedisProcess) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}

// String names the server for messages.
func (p *RedisProcess) String() string { return fmt.Sprintf("redis-server %s", p.addr) }

// Pause stops the server with SIGSTOP, as a stalled host would: it keeps
// its connections and answers nothing until Resume.
func (p *RedisProcess) Pause() { p.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT): the calls it received while
// paused run then.
func (p *RedisProcess) Resume() { p.signal(syscall.SIGCONT) }

func (p *RedisProcess) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		if err := p.cmd.Process.Signal(sig); err != nil {
			p.tb.Errorf("testenv: signal %v to %s: %v", sig, p, err)
		}
	}
}
