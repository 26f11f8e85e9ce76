package main

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Fault windows stretch this long past the fault's end: the api nodes'
// breakers wait a second before they try Redis again, and their
// connections come back after it.
const windowTail = 5 * time.Second

// schedule injects the faults, in cycles of about 5 minutes (one cycle
// for a shorter run), each at its share of the cycle; the tier change and
// the month grant come in the first cycle, a credit grant in each. The
// last tenth of the run has no fault, so that everything is back before
// the load stops.
func (s *soak) schedule(ctx context.Context, ad admin, ts []*tenant, p plan) {
	cycles := max(1, int((s.set.duration+150*time.Second)/(5*time.Minute)))
	cycle := time.Duration(float64(s.set.duration) * 0.9 / float64(cycles))
	begin := time.Now()
	var post, pre []*tenant
	for _, t := range ts {
		switch t.kind {
		case kindPost:
			post = append(post, t)
		case kindPrepaid:
			pre = append(pre, t)
		}
	}
	for c := range cycles {
		steps := []struct {
			at float64
			do func()
		}{
			{0.10, func() { s.killAPI(ctx, 1) }},
			{0.22, func() { s.killWorker(0) }},
			{0.34, func() { s.restartRedis(ctx) }},
			{0.46, func() {
				if c == 0 && len(post) >= 2 {
					s.event("tier change of a postpaid tenant to soak-post-plus (now, carry)", ad.upgrade(ctx, post[0], p))
					s.event(fmt.Sprintf("month grant of %d units to a postpaid tenant", p.grant), ad.grant(ctx, post[1], p.grant))
				}
			}},
			{0.58, func() { s.pauseRedis(ctx) }},
			{0.72, func() { s.restartPostgres(ctx) }},
			{0.86, func() {
				if len(pre) > 0 {
					s.event(fmt.Sprintf("credit grant of %d cents to a prepaid tenant", p.credit), ad.credit(ctx, pre[c%len(pre)], p.credit, "soak: top-up"))
				}
			}},
		}
		for _, st := range steps {
			at := begin.Add(time.Duration(c)*cycle + time.Duration(st.at*float64(cycle)))
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(at)):
			}
			st.do()
		}
	}
}

// killAPI kills api node i with SIGKILL, and starts it again 2 s later.
// The requests in flight on it lose their answers; new ones go to the
// other node.
func (s *soak) killAPI(ctx context.Context, i int) {
	s.nodes[i].down.Store(true)
	s.apis[i].kill()
	time.Sleep(2 * time.Second)
	s.event(fmt.Sprintf("SIGKILL of api node %d, started again", i+1), s.startAPI(ctx, i))
}

// killWorker kills worker i with SIGKILL, and starts it again 2 s later.
func (s *soak) killWorker(i int) {
	s.workers[i].kill()
	time.Sleep(2 * time.Second)
	s.event(fmt.Sprintf("SIGKILL of worker %d, started again", i+1), s.workers[i].start())
}

// restartRedis stops Redis (SIGTERM: it writes its append-only file) and
// starts it again; the stretch is a fail-closed window.
func (s *soak) restartRedis(ctx context.Context) {
	from := time.Now()
	s.redis.stop(syscall.SIGTERM, 20*time.Second)
	err := s.redis.start()
	if err == nil {
		err = waitFor(ctx, s.redis, 30*time.Second, redisPing(s.redisAddr()))
	}
	s.addWindow(from, "Redis restart")
	s.event("restart of Redis (SIGTERM, append-only file kept)", err)
}

// pauseRedis stops Redis with SIGSTOP for 5 s, then SIGCONT.
func (s *soak) pauseRedis(ctx context.Context) {
	from := time.Now()
	err := s.redis.signal(syscall.SIGSTOP)
	if err == nil {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
		err = s.redis.signal(syscall.SIGCONT)
	}
	s.addWindow(from, "Redis paused")
	s.event("pause of Redis (SIGSTOP for 5s, then SIGCONT)", err)
}

// restartPostgres stops Postgres (SIGINT: fast shutdown) and starts it
// again. No fail-closed window: the api keeps serving without Postgres.
func (s *soak) restartPostgres(ctx context.Context) {
	s.pg.stop(syscall.SIGINT, 30*time.Second)
	err := s.pg.start()
	if err == nil {
		err = waitFor(ctx, s.pg, 60*time.Second, func() error { return pgExec(ctx, s.dbURL, "SELECT 1") })
	}
	s.event("restart of Postgres (fast shutdown)", err)
}

func (s *soak) addWindow(from time.Time, what string) {
	s.mu.Lock()
	s.windows = append(s.windows, window{from: from, to: time.Now().Add(windowTail), what: what})
	s.mu.Unlock()
}

func (s *soak) redisAddr() string {
	return s.redisURL[len("redis://") : len(s.redisURL)-len("/0")]
}

// redisPing is nil once Redis answers PING with PONG (not LOADING).
func redisPing(addr string) func() error {
	return func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return err
		}
		b := make([]byte, 64)
		n, err := c.Read(b)
		if err != nil {
			return err
		}
		if string(b[:n]) != "+PONG\r\n" {
			return fmt.Errorf("PING answered %q", b[:n])
		}
		return nil
	}
}
