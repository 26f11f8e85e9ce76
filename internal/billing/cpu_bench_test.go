package billing

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// cpuUse is the CPU time, in seconds, spent so far by the parts of a
// benchmark's system: this process (the workers), Redis (every master, from
// INFO cpu) and the Postgres processes of this machine (from /proc; none
// when Postgres runs elsewhere, and every database's, so nothing else should
// run meanwhile).
type cpuUse struct {
	workers, redis, postgres float64
	local                    bool // Postgres processes were found in /proc
}

// cpuNow reads cpuUse.
func cpuNow(tb testing.TB, rdb redis.UniversalClient) cpuUse {
	tb.Helper()
	var u cpuUse
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	u.workers = float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
	infoCPU := func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\r\n") {
			name, v, ok := strings.Cut(line, ":")
			if ok && (name == "used_cpu_sys" || name == "used_cpu_user") {
				f, _ := strconv.ParseFloat(v, 64)
				u.redis += f
			}
		}
		return nil
	}
	ctx := context.Background()
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		// (one master at a time: the callback adds to u)
		var masters []*redis.Client
		err = c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
			masters = append(masters, m)
			return nil
		})
		for _, m := range masters {
			if err == nil {
				err = infoCPU(ctx, m)
			}
		}
	case *redis.Client:
		err = infoCPU(ctx, c)
	}
	if err != nil {
		tb.Fatal(err)
	}
	procs, _ := os.ReadDir("/proc")
	tick := 100.0 // USER_HZ, 100 on Linux
	for _, p := range procs {
		b, err := os.ReadFile("/proc/" + p.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open || !strings.HasPrefix(s[open+1:closing], "postgres") {
			continue
		}
		f := strings.Fields(s[closing+1:]) // from the state on: utime and stime are the 12th and 13th
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		u.postgres += (ut + st) / tick
		u.local = true
	}
	return u
}

// since is the CPU time spent from u0 to u.
func (u cpuUse) since(u0 cpuUse) cpuUse {
	return cpuUse{workers: u.workers - u0.workers, redis: u.redis - u0.redis, postgres: u.postgres - u0.postgres,
		local: u.local && u0.local}
}

// report adds the CPU seconds per iteration to b's metrics.
func (u cpuUse) report(b *testing.B) {
	n := float64(b.N)
	b.ReportMetric(u.workers/n, "worker-cpu-s/op")
	b.ReportMetric(u.redis/n, "redis-cpu-s/op")
	if u.local {
		b.ReportMetric(u.postgres/n, "postgres-cpu-s/op")
	}
}
