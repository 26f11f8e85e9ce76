package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// OwnCluster is a Redis Cluster that one test starts for itself, on its own
// loopback ports, and reshapes: it moves slots between masters the way
// redis-cli --cluster reshard does (SETSLOT IMPORTING and MIGRATING,
// MIGRATE of the slot's keys, SETSLOT NODE), adds and removes masters, and
// fails masters over to their replicas. Its processes stop at the test's
// cleanup.
type OwnCluster struct {
	tb  testing.TB
	dir string

	mu    sync.Mutex
	nodes map[string]*exec.Cmd // addr -> its redis-server
}

// ClusterNode is one node of an OwnCluster as CLUSTER NODES reports it.
type ClusterNode struct {
	Addr, ID string
	Master   bool
	MasterID string // a replica's master
	Slots    int    // how many slots a master serves
}

// StartOwnCluster starts masters masters, each with replicas replicas,
// joined with redis-cli --cluster create, and waits until every node sees
// the cluster ok. A node that stops answering is marked failing after a
// node timeout of one second, so a killed master's replica is promoted
// within a few seconds. Without redis-server the test fails with a message
// saying what to install.
func StartOwnCluster(tb testing.TB, masters, replicas int) *OwnCluster {
	tb.Helper()
	Integration(tb, "a Redis Cluster of redis-server processes")
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			tb.Fatalf("testenv: %s not found in PATH: install redis-server (apt-get install redis-server)", bin)
		}
	}
	c := &OwnCluster{tb: tb, dir: tb.TempDir(), nodes: map[string]*exec.Cmd{}}
	tb.Cleanup(func() {
		c.stopAll()
		if tb.Failed() {
			c.logTails()
		}
	})
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = c.create(masters, replicas); err == nil {
			return c
		}
		c.stopAll()
	}
	tb.Fatalf("testenv: own Redis Cluster: %v", err)
	return nil
}

func (c *OwnCluster) create(masters, replicas int) error {
	n := masters * (1 + replicas)
	addrs, err := c.startNodes(n)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.waitStable(ctx, n); err != nil {
		return err
	}
	return c.waitReplicas(ctx)
}

// waitReplicas waits until every replica's link to its master is up and
// it has taken all its master has written: a replica still in its first
// sync is no replica to fail over to.
func (c *OwnCluster) waitReplicas(ctx context.Context) error {
	for {
		err := c.replicasInSync(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replicas not in sync (logs in %s): %w", c.dir, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *OwnCluster) replicasInSync(ctx context.Context) error {
	for _, a := range c.running() {
		n := c.node(a)
		info, err := n.Info(ctx, "replication").Result()
		n.Close()
		if err != nil {
			return err
		}
		if strings.Contains(info, "role:slave") && !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replica %s: link to its master down", a)
		}
	}
	return nil
}

// startNodes starts n cluster-enabled redis-servers that know no other node.
func (c *OwnCluster) startNodes(n int) ([]string, error) {
	ports, err := clusterPorts(n)
	if err != nil {
		return nil, err
	}
	var addrs []string
	for _, p := range ports {
		ps := strconv.Itoa(p)
		cmd := exec.Command("redis-server",
			"--port", ps,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(c.dir, "nodes-"+ps+".conf"),
			"--cluster-node-timeout", "1000",
			"--repl-diskless-sync-delay", "0",
			"--dir", c.dir,
			"--save", "",
			"--appendonly", "no",
			"--bind", "127.0.0.1",
			"--daemonize", "no",
			"--logfile", filepath.Join(c.dir, "redis-"+ps+".log"),
		)
		cmd.SysProcAttr = dieWithParent()
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("start redis-server: %w", err)
		}
		addr := "127.0.0.1:" + ps
		c.mu.Lock()
		c.nodes[addr] = cmd
		c.mu.Unlock()
		addrs = append(addrs, addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range addrs {
		if err := waitNode(ctx, a, func(n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
			return nil, fmt.Errorf("redis-server on %s did not start (log in %s): %w", a, c.dir, err)
		}
	}
	return addrs, nil
}

// waitStable waits until every running node reports the cluster ok with n
// known nodes and agrees on every master's slots.
func (c *OwnCluster) waitStable(ctx context.Context, n int) error {
	for {
		err := c.stable(ctx, n)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not stable (logs in %s): %w", c.dir, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *OwnCluster) stable(ctx context.Context, n int) error {
	var want string
	for _, a := range c.running() {
		cl := c.node(a)
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			cl.Close()
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
			cl.Close()
			return fmt.Errorf("node %s: %s", a, strings.ReplaceAll(info[:min(len(info), 80)], "\r\n", " "))
		}
		nodes, err := cl.ClusterNodes(ctx).Result()
		cl.Close()
		if err != nil {
			return err
		}
		view := slotView(nodes)
		if want == "" {
			want = view
		} else if view != want {
			return fmt.Errorf("node %s sees slots %s, another %s", a, view, want)
		}
	}
	return nil
}

// slotView is the slots of each master in a CLUSTER NODES answer, sorted,
// as one string: two nodes that agree on the slots give the same.
func slotView(nodes string) string {
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(l)
		if len(f) < 8 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		lines = append(lines, f[0]+" "+strings.Join(f[8:], " "))
	}
	slices.Sort(lines)
	return strings.Join(lines, ";")
}

func (c *OwnCluster) running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.nodes))
	for a := range c.nodes {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// node returns a client of the one node at addr; the caller closes it.
func (c *OwnCluster) node(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DialTimeout: time.Second, MaxRetries: -1})
}

// Client returns a cluster client of its own, closed at cleanup, with the
// options the API uses.
func (c *OwnCluster) Client() *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs:        c.running(),
		Protocol:     2,
		DialTimeout:  2 * time.Second,
		ReadTimeout:  5 * time.Second,
		WriteTimeout: 5 * time.Second,
	})
	c.tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Nodes returns the nodes as the node at any running address sees them.
func (c *OwnCluster) Nodes() []ClusterNode {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var lastErr error
	for _, a := range c.running() {
		n := c.node(a)
		text, err := n.ClusterNodes(ctx).Result()
		n.Close()
		if err != nil {
			lastErr = err
			continue
		}
		var out []ClusterNode
		for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
			f := strings.Fields(l)
			if len(f) < 8 || strings.Contains(f[2], "fail") || strings.Contains(f[2], "noaddr") {
				continue
			}
			addr, _, _ := strings.Cut(f[1], "@")
			cn := ClusterNode{Addr: addr, ID: f[0], Master: strings.Contains(f[2], "master")}
			if !cn.Master {
				cn.MasterID = f[3]
			}
			for _, r := range f[8:] {
				if strings.HasPrefix(r, "[") {
					continue // a slot being moved
				}
				lo, hi, found := strings.Cut(r, "-")
				a, _ := strconv.Atoi(lo)
				b := a
				if found {
					b, _ = strconv.Atoi(hi)
				}
				cn.Slots += b - a + 1
			}
			out = append(out, cn)
		}
		return out
	}
	c.tb.Fatalf("testenv: CLUSTER NODES: %v", lastErr)
	return nil
}

// Masters returns the masters, in address order.
func (c *OwnCluster) Masters() []ClusterNode {
	var out []ClusterNode
	for _, n := range c.Nodes() {
		if n.Master {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b ClusterNode) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// ReplicaOf returns a replica of master.
func (c *OwnCluster) ReplicaOf(master ClusterNode) ClusterNode {
	c.tb.Helper()
	for _, n := range c.Nodes() {
		if !n.Master && n.MasterID == master.ID {
			return n
		}
	}
	c.tb.Fatalf("testenv: master %s has no replica", master.Addr)
	return ClusterNode{}
}

// OwnerOf returns the master serving slot.
func (c *OwnCluster) OwnerOf(slot int) ClusterNode {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := c.node(c.running()[0])
	defer n.Close()
	shards, err := n.ClusterShards(ctx).Result()
	if err != nil {
		c.tb.Fatalf("testenv: CLUSTER SHARDS: %v", err)
	}
	for _, sh := range shards {
		if !slices.ContainsFunc(sh.Slots, func(r redis.SlotRange) bool { return r.Start <= int64(slot) && int64(slot) <= r.End }) {
			continue
		}
		for _, m := range sh.Nodes {
			if m.Role == "master" && m.Health == "online" {
				return ClusterNode{Addr: net.JoinHostPort(m.IP, strconv.FormatInt(m.Port, 10)), ID: m.ID, Master: true}
			}
		}
	}
	c.tb.Fatalf("testenv: no master serves slot %d", slot)
	return ClusterNode{}
}

// MoveSlot moves slot, with its keys, from the master serving it to to,
// as redis-cli --cluster reshard does: to imports it, its owner migrates
// it, the keys go over batch keys at a time (MIGRATE), then every master
// is told its new owner. step, when not nil, runs after each stage (the
// slot marked migrating, each batch of keys moved), so that a test can
// let traffic reach the slot in each of them.
func (c *OwnCluster) MoveSlot(slot int, to ClusterNode, batch int, step func()) {
	c.tb.Helper()
	from := c.OwnerOf(slot)
	if from.ID == to.ID {
		return
	}
	if step == nil {
		step = func() {}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src, dst := c.node(from.Addr), c.node(to.Addr)
	defer src.Close()
	defer dst.Close()
	must := func(what string, err error) {
		if err != nil {
			c.tb.Fatalf("testenv: move slot %d from %s to %s: %s: %v", slot, from.Addr, to.Addr, what, err)
		}
	}
	must("IMPORTING", dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.ID).Err())
	must("MIGRATING", src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.ID).Err())
	step()
	host, port, _ := strings.Cut(to.Addr, ":")
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, batch).Result()
		must("GETKEYSINSLOT", err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		must("MIGRATE", src.Do(ctx, args...).Err())
		step()
	}
	// The new owner first, then the old, then the others (as redis-cli).
	must("NODE on the new owner", dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.ID).Err())
	// An old owner that gave its last slot away makes itself a replica of
	// the node that took it, and learns the slot from it.
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.ID).Err(); err != nil && !strings.Contains(err.Error(), "only with masters") {
		must("NODE on the old owner", err)
	}
	for _, m := range c.Masters() {
		if m.ID == from.ID || m.ID == to.ID {
			continue
		}
		n := c.node(m.Addr)
		err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.ID).Err()
		n.Close()
		must("NODE on "+m.Addr, err)
	}
}

// AddMaster starts a new node and joins it to the cluster as a master
// serving no slot (CLUSTER MEET), as redis-cli --cluster add-node does, but
// without copying anything to it: it has no Function library.
func (c *OwnCluster) AddMaster() ClusterNode {
	c.tb.Helper()
	before := len(c.running())
	addrs, err := c.startNodes(1)
	if err != nil {
		c.tb.Fatalf("testenv: add master: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := c.node(addrs[0])
	defer n.Close()
	host, port, _ := strings.Cut(c.running()[0], ":")
	if addrs[0] == c.running()[0] {
		host, port, _ = strings.Cut(c.running()[1], ":")
	}
	p, _ := strconv.Atoi(port)
	if err := n.ClusterMeet(ctx, host, strconv.Itoa(p)).Err(); err != nil {
		c.tb.Fatalf("testenv: CLUSTER MEET: %v", err)
	}
	if err := c.waitStable(ctx, before+1); err != nil {
		c.tb.Fatalf("testenv: add master: %v", err)
	}
	id, err := n.ClusterMyID(ctx).Result()
	if err != nil {
		c.tb.Fatalf("testenv: CLUSTER MYID: %v", err)
	}
	return ClusterNode{Addr: addrs[0], ID: id, Master: true}
}

// RemoveNode takes a node that serves no slot out of the cluster (CLUSTER
// FORGET on every other node) and stops it.
func (c *OwnCluster) RemoveNode(gone ClusterNode) {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.stop(gone.Addr)
	for _, a := range c.running() {
		n := c.node(a)
		err := n.ClusterForget(ctx, gone.ID).Err()
		n.Close()
		if err != nil && !strings.Contains(err.Error(), "Unknown node") {
			c.tb.Fatalf("testenv: CLUSTER FORGET on %s: %v", a, err)
		}
	}
	if err := c.waitStable(ctx, len(c.running())); err != nil {
		c.tb.Fatalf("testenv: remove node: %v", err)
	}
}

// Failover promotes replica in place of its master with CLUSTER FAILOVER
// (the master stops taking writes, the replica catches up with it, then
// takes its slots: no acknowledged write is lost), once every replica's
// link is up, and waits until every node agrees.
func (c *OwnCluster) Failover(replica ClusterNode) {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.waitReplicas(ctx); err != nil {
		c.tb.Fatalf("testenv: failover: %v", err)
	}
	n := c.node(replica.Addr)
	defer n.Close()
	if err := n.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
		c.tb.Fatalf("testenv: CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	c.waitMaster(ctx, n, replica.Addr)
	if err := c.waitStable(ctx, len(c.running())); err != nil {
		c.tb.Fatalf("testenv: failover: %v", err)
	}
}

// Kill stops the node at addr with SIGKILL: whatever it acknowledged and
// had not yet sent to its replicas is lost.
func (c *OwnCluster) Kill(addr string) { c.stop(addr) }

// WaitPromoted waits until replica is a master (its master killed, the
// cluster voted) and every running node agrees on the slots. The dead
// master stays known as failed.
func (c *OwnCluster) WaitPromoted(replica ClusterNode) {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := c.node(replica.Addr)
	defer n.Close()
	c.waitMaster(ctx, n, replica.Addr)
	for {
		info, err := n.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return
		}
		select {
		case <-ctx.Done():
			c.tb.Fatalf("testenv: cluster not ok after the promotion of %s: %v", replica.Addr, info)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *OwnCluster) waitMaster(ctx context.Context, n *redis.Client, addr string) {
	c.tb.Helper()
	for {
		info, err := n.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:master") {
			return
		}
		select {
		case <-ctx.Done():
			c.tb.Fatalf("testenv: %s is not a master: %v %v", addr, info, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Signal sends sig to the node at addr (SIGSTOP freezes a replica, so
// that its master's writes stop reaching it; SIGCONT resumes it).
func (c *OwnCluster) Signal(addr string, sig syscall.Signal) {
	c.tb.Helper()
	c.mu.Lock()
	p := c.nodes[addr]
	c.mu.Unlock()
	if p == nil {
		c.tb.Fatalf("testenv: no node %s", addr)
	}
	if err := p.Process.Signal(sig); err != nil {
		c.tb.Fatalf("testenv: signal %s: %v", addr, err)
	}
}

func (c *OwnCluster) stop(addr string) {
	c.mu.Lock()
	p := c.nodes[addr]
	delete(c.nodes, addr)
	c.mu.Unlock()
	if p != nil {
		_ = p.Process.Signal(syscall.SIGCONT)
		_ = p.Process.Kill()
		_ = p.Wait()
	}
}

// logTails logs the end of every node's log, for a failed test.
func (c *OwnCluster) logTails() {
	logs, _ := filepath.Glob(filepath.Join(c.dir, "redis-*.log"))
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		c.tb.Logf("%s:\n%s", filepath.Base(f), strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}

func (c *OwnCluster) stopAll() {
	for _, a := range c.running() {
		c.stop(a)
	}
}
