package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const clusterHowTo = "install redis-server (apt-get install redis-server) or set REDIS_CLUSTER_URL " +
	"to the comma-separated addresses of a Redis Cluster"

// cluster is the loopback Redis Cluster of this test binary, started by the
// first Cluster call and stopped by StopCluster.
var cluster struct {
	once  sync.Once
	addrs []string
	err   error

	mu    sync.Mutex
	procs []*exec.Cmd
	dir   string
}

// Cluster returns a client of its own on a Redis Cluster with three masters,
// closed at cleanup. Keys of different hash tags land on different nodes, so
// a script that touches keys of two slots fails with CROSSSLOT, as it would
// in production.
//
// REDIS_CLUSTER_URL (comma-separated host:port or redis:// addresses) names an
// existing cluster. Otherwise the first call starts one, once per test
// binary: three redis-server processes on free loopback ports, joined with
// redis-cli --cluster create. The processes outlive any single test (a
// tb.Cleanup would stop them under the tests still using them), so the
// package's TestMain must call StopCluster after m.Run. Without redis-server
// the test fails with a message saying what to install: it never skips.
func Cluster(tb testing.TB) redis.UniversalClient {
	tb.Helper()
	Integration(tb, "a Redis Cluster")
	cluster.once.Do(func() {
		if env := os.Getenv("REDIS_CLUSTER_URL"); env != "" {
			cluster.addrs, cluster.err = parseClusterURL(env)
			return
		}
		for attempt := 0; attempt < 3; attempt++ {
			// A port picked free can be taken before redis-server binds it;
			// a new set of ports then usually works.
			if cluster.addrs, cluster.err = startCluster(); cluster.err == nil {
				return
			}
			StopCluster()
		}
	})
	if cluster.err != nil {
		tb.Fatalf("testenv: Redis Cluster: %v: %s", cluster.err, clusterHowTo)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        cluster.addrs,
		Protocol:     2,
		DialTimeout:  2 * time.Second,
		ReadTimeout:  5 * time.Second,
		WriteTimeout: 5 * time.Second,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Ping(ctx).Err()
	}); err != nil {
		_ = c.Close()
		tb.Fatalf("testenv: Redis Cluster %v: %v: %s", cluster.addrs, err, clusterHowTo)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// StopCluster stops the Redis Cluster that Cluster started, if any, and
// removes its files. Call it from TestMain after m.Run; it does nothing for a
// REDIS_CLUSTER_URL cluster.
func StopCluster() {
	cluster.mu.Lock()
	defer cluster.mu.Unlock()
	for _, p := range cluster.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	cluster.procs = nil
	if cluster.dir != "" {
		_ = os.RemoveAll(cluster.dir)
		cluster.dir = ""
	}
}

func parseClusterURL(env string) ([]string, error) {
	var addrs []string
	for _, part := range strings.Split(env, ",") {
		part = strings.TrimSpace(part)
		if strings.Contains(part, "://") {
			o, err := redis.ParseURL(part)
			if err != nil {
				return nil, fmt.Errorf("REDIS_CLUSTER_URL: %w", err)
			}
			part = o.Addr
		}
		if part == "" {
			return nil, fmt.Errorf("REDIS_CLUSTER_URL: empty address in %q", env)
		}
		addrs = append(addrs, part)
	}
	return addrs, nil
}

// startCluster starts three cluster-enabled redis-servers and joins them.
func startCluster() ([]string, error) {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s not found in PATH", bin)
		}
	}
	dir, err := os.MkdirTemp("", "tollgate-cluster-")
	if err != nil {
		return nil, err
	}
	cluster.mu.Lock()
	cluster.dir = dir
	cluster.mu.Unlock()

	ports, err := clusterPorts(3)
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, p := range ports {
		ps := strconv.Itoa(p)
		cmd := exec.Command("redis-server",
			"--port", ps,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes-"+ps+".conf"),
			"--dir", dir,
			"--save", "",
			"--appendonly", "no",
			"--bind", "127.0.0.1",
			"--daemonize", "no",
			"--logfile", filepath.Join(dir, "redis-"+ps+".log"),
		)
		cmd.SysProcAttr = dieWithParent()
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		cluster.mu.Lock()
		cluster.procs = append(cluster.procs, cmd)
		cluster.mu.Unlock()
		addrs = append(addrs, "127.0.0.1:"+ps)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range addrs {
		if err := waitNode(ctx, a, func(n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
			return nil, fmt.Errorf("redis-server on %s did not start (log in %s): %w", a, dir, err)
		}
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	for _, a := range addrs {
		err := waitNode(ctx, a, func(n *redis.Client) error {
			info, err := n.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
				return fmt.Errorf("cluster not ready: %s", firstLine(info))
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", a, err)
		}
	}
	return addrs, nil
}

// waitNode retries ready against the node at addr until it succeeds or ctx
// ends.
func waitNode(ctx context.Context, addr string, ready func(*redis.Client) error) error {
	n := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DialTimeout: time.Second})
	defer n.Close()
	for {
		err := ready(n)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// clusterPorts picks n ports that are free on loopback together with their
// cluster bus ports (port + 10000), so every port stays below 55535.
func clusterPorts(n int) ([]int, error) {
	taken := map[int]bool{}
	var ports []int
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p, err := freePort(0)
		if err != nil {
			return nil, err
		}
		if p >= 55535 || taken[p] || taken[p+10000] {
			continue
		}
		if _, err := freePort(p + 10000); err != nil {
			continue
		}
		taken[p], taken[p+10000] = true, true
		ports = append(ports, p)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("found only %d free port pairs below 55535", len(ports))
	}
	return ports, nil
}

// freePort listens on 127.0.0.1:port (0: any) and returns the port it got
// after closing the listener.
func freePort(port int) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// dieWithParent asks the kernel to kill the child when the test binary dies
// without reaching StopCluster (a panic, a -timeout). Pdeathsig exists only on
// Linux; it is set by name so that this file builds everywhere, and elsewhere
// StopCluster remains the only clean-up.
func dieWithParent() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{}
	if f := reflect.ValueOf(attr).Elem().FieldByName("Pdeathsig"); f.IsValid() && f.CanSet() {
		f.Set(reflect.ValueOf(syscall.SIGKILL))
	}
	return attr
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(s)
}
