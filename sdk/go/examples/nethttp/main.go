// Command nethttp is an API served with net/http whose requests Tollgate
// admits: every route counts one unit of the meter "hello", except POST
// /reports, which counts ?pages= units of "reports". A refused request is
// answered Tollgate's 429 (or 402) as it is; a 5xx of a handler is
// refunded.
//
//	TOLLGATE_URL=http://127.0.0.1:8080 TOLLGATE_SERVICE_TOKEN=... ADDR=127.0.0.1:8090 go run ./examples/nethttp
//	curl -H 'Authorization: Bearer tg_...' http://127.0.0.1:8090/hello
//
// FAIL_OPEN=true serves requests while Tollgate is unreachable.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	if err := run(ctx, log); err != nil {
		fmt.Fprintln(os.Stderr, "nethttp:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	base, token := os.Getenv("TOLLGATE_URL"), os.Getenv("TOLLGATE_SERVICE_TOKEN")
	if base == "" || token == "" {
		return errors.New("set TOLLGATE_URL and TOLLGATE_SERVICE_TOKEN")
	}
	addr := os.Getenv("ADDR")
	if addr == "" {
		addr = "127.0.0.1:8090"
	}
	failOpen, _ := strconv.ParseBool(os.Getenv("FAIL_OPEN"))

	client := tollgate.NewServiceClient(base, token, tollgate.WithTimeout(time.Second))
	gate := tollgate.NewGate(client, tollgate.GateOptions{
		Meter: "hello", FailOpen: failOpen, RefundOnServerError: true,
		OnError: func(err error) { log.Warn("tollgate", "err", err) },
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		a, _ := tollgate.AdmissionFrom(r.Context())
		fmt.Fprintf(w, "hello, tenant %s\n", a.TenantID)
	})
	mux.HandleFunc("POST /reports", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "report of %d pages\n", pages(r))
	})
	mux.HandleFunc("GET /broken", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "something broke", http.StatusInternalServerError) // refunded
	})
	h := gate.Middleware(tollgate.HTTPOptions{
		Meter: func(r *http.Request) string {
			if r.URL.Path == "/reports" {
				return "reports"
			}
			return "" // the Gate's: hello
		},
		Cost: pages,
	})(mux)

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	log.Info("listening", "addr", ln.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// pages is the number of pages a request asks for: ?pages=, at least 1.
func pages(r *http.Request) int64 {
	n, _ := strconv.ParseInt(r.URL.Query().Get("pages"), 10, 64)
	return max(n, 1)
}
