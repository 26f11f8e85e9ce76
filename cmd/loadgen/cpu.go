package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Where a row's CPU goes. The machine's cores are shared by the load
// generator, the server measured and Redis, so a row's req/s is bounded by
// the CPU time each request costs them together. loadgen measures the load
// generator's (getrusage of itself and of its finished children: wrk), the
// api's (its /metrics process_cpu_seconds_total), a peer's (/proc/<pid>/stat,
// given its pid) and Redis's (INFO cpu) before and after a row; a peer whose
// pid it was not given is left what the cores did not spend on the others.

// cpuSample is the CPU time, in seconds, each part has used so far; server
// is negative when unknown.
type cpuSample struct{ loadgen, server, redis float64 }

// sampleCPU reads every part's CPU time; server (nil: unknown) reads the
// server's.
func sampleCPU(ctx context.Context, rdb redis.UniversalClient, server func(context.Context) (float64, error)) (cpuSample, error) {
	s := cpuSample{server: -1}
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			return cpuSample{}, fmt.Errorf("getrusage: %w", err)
		}
		s.loadgen += float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
	}
	var mu sync.Mutex
	err := forEachMaster(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return fmt.Errorf("INFO cpu on %s: %w", c.Options().Addr, err)
		}
		v, err := parseRedisCPU(info)
		mu.Lock()
		s.redis += v
		mu.Unlock()
		return err
	})
	if err != nil {
		return cpuSample{}, err
	}
	if server != nil {
		if s.server, err = server(ctx); err != nil {
			return cpuSample{}, err
		}
	}
	return s, nil
}

// apiCPUOf reads the CPU seconds of the api at base from its /metrics.
func apiCPUOf(base string) func(context.Context) (float64, error) {
	return func(ctx context.Context) (float64, error) { return apiMetric(ctx, base, "process_cpu_seconds_total") }
}

// apiMetric reads the value of an unlabelled metric of the api at base
// from its /metrics.
func apiMetric(ctx context.Context, base, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("the api's /metrics: %w", err)
	}
	defer resp.Body.Close()
	return parseMetric(resp.Body, name)
}

// procCPUOf reads the CPU seconds of process pid from /proc; nil for pid 0
// (unknown).
func procCPUOf(pid int) func(context.Context) (float64, error) {
	if pid == 0 {
		return nil
	}
	return func(context.Context) (float64, error) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return 0, fmt.Errorf("the CPU time of process %d: %w", pid, err)
		}
		return parseProcStat(string(b))
	}
}

// userHZ is the unit of /proc/<pid>/stat's times: 100 a second on every
// Linux architecture Go supports (USER_HZ, fixed by the kernel's ABI).
const userHZ = 100

// parseProcStat sums utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line, in seconds. The command name (field 2) is in
// parentheses and may hold spaces and parentheses: the fields are counted
// from the last ')'.
func parseProcStat(stat string) (float64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat %.80q: no command name", stat)
	}
	f := strings.Fields(stat[i+1:]) // from field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat %.80q: %d fields after the command name, want at least 13", stat, len(f))
	}
	var sum float64
	for _, v := range f[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc stat %.80q: %w", stat, err)
		}
		sum += float64(n) / userHZ
	}
	return sum, nil
}

// parseRedisCPU sums used_cpu_sys and used_cpu_user of INFO cpu.
func parseRedisCPU(info string) (float64, error) {
	var sum float64
	n := 0
	for _, l := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s=%q: %w", k, v, err)
		}
		sum += f
		n++
	}
	if n != 2 {
		return 0, fmt.Errorf("INFO cpu lacks used_cpu_sys or used_cpu_user")
	}
	return sum, nil
}

// parseProcessCPU reads process_cpu_seconds_total from Prometheus text.
func parseProcessCPU(r io.Reader) (float64, error) {
	return parseMetric(r, "process_cpu_seconds_total")
}

// parseMetric reads the value of the unlabelled metric name from
// Prometheus text.
func parseMetric(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in the api's /metrics", name)
}

// cpuRow is one row's CPU per request, in µs.
type cpuRow struct {
	row                    string
	rps                    float64
	loadgen, server, redis float64 // server < 0: unknown
	wall                   float64 // seconds the row ran
}

func cpuPerRequest(row string, r Result, before, after cpuSample) cpuRow {
	n := float64(r.Requests)
	c := cpuRow{row: row, rps: r.RPS, server: -1}
	if n == 0 {
		return c
	}
	c.loadgen = (after.loadgen - before.loadgen) * 1e6 / n
	c.redis = (after.redis - before.redis) * 1e6 / n
	if before.server >= 0 && after.server >= 0 {
		c.server = (after.server - before.server) * 1e6 / n
	}
	if r.RPS > 0 {
		c.wall = n / r.RPS
	}
	return c
}

// printCPU prints where the rows' CPU went and what the hot tenant's goal
// would take: at goalRPS, the cores that the load generator, the api and
// Redis need at the CPU per request measured for the hot tenant's row.
func printCPU(out io.Writer, rs rows, goalRPS float64) {
	cores := float64(runtime.NumCPU())
	fmt.Fprintf(out, "\nCPU per request, µs (load generator: getrusage of loadgen and wrk; api: its process_cpu_seconds_total;\n"+
		"peer: /proc/<pid>/stat; Redis: INFO cpu; %d cores):\n", runtime.NumCPU())
	fmt.Fprintf(out, "%-22s %10s %10s %10s %10s %12s\n", "row", "load gen", "server", "Redis", "total", "cores used")
	for _, r := range rs.all() {
		if !r.cpu {
			continue
		}
		c := r.use
		server, total := "", c.loadgen+c.redis
		if c.server >= 0 {
			server, total = fmt.Sprintf("%.1f", c.server), total+c.server
		} else {
			// what the cores left to the server, per request
			server = fmt.Sprintf("≤ %.1f", max(0, cores*1e6/max(c.rps, 1)-total))
		}
		fmt.Fprintf(out, "%-22s %10.1f %10s %10.1f %10.1f %12.2f\n", c.row, c.loadgen, server, c.redis, total, total*c.rps/1e6)
	}
	if c := rs.hot.use; c.server >= 0 && goalRPS > 0 {
		need := (c.loadgen + c.server + c.redis) * goalRPS / 1e6
		fmt.Fprintf(out, "%s at the goal's %.0f req/s would need %.2f cores at this CPU per request (%d here): "+
			"load generator %.2f, api %.2f, Redis %.2f\n", c.row, goalRPS, need, runtime.NumCPU(),
			c.loadgen*goalRPS/1e6, c.server*goalRPS/1e6, c.redis*goalRPS/1e6)
	}
}
