// Command api is Tollgate's HTTP server: metered routes, the service check,
// admin REST and the dashboard (internal/app, RunAPI). `api -healthcheck`
// checks the local server instead.
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/tollgate/tollgate/internal/app"
	"github.com/tollgate/tollgate/internal/config"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-healthcheck" {
		os.Exit(healthcheck(os.Getenv))
	}
	os.Exit(app.Main("api", app.RunAPI))
}

// healthcheck GETs /healthz of the local server: the Docker health check of
// an image that has no curl.
func healthcheck(getenv func(string) string) int {
	cfg, err := config.Load(getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		return 1
	}
	_, port, _ := net.SplitHostPort(cfg.Addr)
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + net.JoinHostPort("127.0.0.1", port) + "/healthz")
	if err != nil {
		fmt.Fprintln(os.Stderr, "api: healthcheck:", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(os.Stderr, "api: healthcheck: status", resp.StatusCode)
		return 1
	}
	return 0
}
