package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Where a row's CPU goes. The machine's cores are shared by loadgen, the
// server measured and Redis, so a row's req/s is bounded by the CPU time
// each request costs them together. loadgen measures its own (getrusage),
// the api's (its /metrics process_cpu_seconds_total) and Redis's (INFO cpu)
// before and after a row; a peer (bare, redis_rate) has no metrics, so its
// own share is what is left of the cores.

// cpuSample is the CPU time, in seconds, each part has used so far; api
// is negative when the server has no process metrics.
type cpuSample struct{ loadgen, api, redis float64 }

func sampleCPU(ctx context.Context, t *target, rdb redis.UniversalClient, withAPI bool) (cpuSample, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return cpuSample{}, fmt.Errorf("getrusage: %w", err)
	}
	s := cpuSample{api: -1,
		loadgen: float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6}
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
	if withAPI {
		req, err := http.NewRequestWithContext(ctx, "GET", t.base+"/metrics", nil)
		if err != nil {
			return cpuSample{}, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return cpuSample{}, fmt.Errorf("the api's /metrics: %w", err)
		}
		defer resp.Body.Close()
		if s.api, err = parseProcessCPU(resp.Body); err != nil {
			return cpuSample{}, err
		}
	}
	return s, nil
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
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no process_cpu_seconds_total in the api's /metrics")
}

// cpuRow is one row's CPU per request, in µs.
type cpuRow struct {
	row                 string
	rps                 float64
	loadgen, api, redis float64 // api < 0: unknown (a peer)
	wall                float64 // seconds the row ran
}

func cpuPerRequest(row string, r Result, before, after cpuSample) cpuRow {
	n := float64(r.Requests)
	c := cpuRow{row: row, rps: r.RPS, api: -1}
	if n == 0 {
		return c
	}
	c.loadgen = (after.loadgen - before.loadgen) * 1e6 / n
	c.redis = (after.redis - before.redis) * 1e6 / n
	if before.api >= 0 && after.api >= 0 {
		c.api = (after.api - before.api) * 1e6 / n
	}
	if r.RPS > 0 {
		c.wall = n / r.RPS
	}
	return c
}

// printCPU prints where the rows' CPU went and what the admitted goal
// would take: at goal × redis_rate's req/s, the cores that loadgen, the api
// and Redis need at the CPU per request measured for the admitted row.
func printCPU(out io.Writer, rows []cpuRow, goalRPS float64) {
	cores := float64(runtime.NumCPU())
	fmt.Fprintf(out, "\nCPU per request, µs (loadgen: getrusage; api: its process_cpu_seconds_total; Redis: INFO cpu; %d cores):\n", runtime.NumCPU())
	fmt.Fprintf(out, "%-17s %10s %10s %10s %10s %12s\n", "row", "loadgen", "server", "Redis", "total", "cores used")
	for _, c := range rows {
		server, total := "peer: n/a", c.loadgen+c.redis
		if c.api >= 0 {
			server, total = fmt.Sprintf("%.1f", c.api), total+c.api
		} else {
			// what the cores left to the peer, per request
			server = fmt.Sprintf("≤ %.1f", max(0, cores*1e6/max(c.rps, 1)-total))
		}
		fmt.Fprintf(out, "%-17s %10.1f %10s %10.1f %10.1f %12.2f\n", c.row, c.loadgen, server, c.redis, total, total*c.rps/1e6)
	}
	for _, c := range rows {
		if c.row == "metered admitted" && c.api >= 0 && goalRPS > 0 {
			need := (c.loadgen + c.api + c.redis) * goalRPS / 1e6
			fmt.Fprintf(out, "metered admitted at the goal's %.0f req/s would need %.2f cores at this CPU per request (%d here): "+
				"loadgen %.2f, api %.2f, Redis %.2f\n", goalRPS, need, runtime.NumCPU(),
				c.loadgen*goalRPS/1e6, c.api*goalRPS/1e6, c.redis*goalRPS/1e6)
		}
	}
}
