package tollgate_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	tollgate "github.com/tollgate/tollgate/sdk/go"
)

// A backend meters work it serves itself: check, work, settle to the
// actual cost (or refund on failure).
func ExampleServiceClient_Check() {
	ctx := context.Background()
	c := tollgate.NewServiceClient("http://127.0.0.1:8080", "the-service-token", tollgate.WithTimeout(time.Second))
	res, err := c.Check(ctx, tollgate.CheckRequest{APIKey: "tg_key", Meter: "tokens", Cost: 1000})
	switch {
	case tollgate.IsOutage(err):
		fmt.Println("Tollgate is away:", err)
	case err != nil:
		p := tollgate.AsProblem(err)
		fmt.Println("refused by Tollgate:", p.Status, p.Detail, p.Field)
	case !res.Allowed:
		fmt.Println("over quota:", res.Status, res.Headers["Retry-After"], string(res.RefusalBody()))
	default:
		if _, err := c.Settle(ctx, res.TenantID, res.RequestID, 420); err != nil && !tollgate.IsConflict(err) {
			fmt.Println("settle:", err)
		}
	}
}

// An API served with net/http admits each request through Tollgate.
func ExampleGate_Middleware() {
	gate := tollgate.NewGate(tollgate.NewServiceClient("http://127.0.0.1:8080", "the-service-token", tollgate.WithTimeout(300*time.Millisecond)),
		tollgate.GateOptions{Meter: "requests", FailOpen: true, RefundOnServerError: true})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		a, _ := tollgate.AdmissionFrom(r.Context())
		fmt.Fprintln(w, "hello, tenant", a.TenantID)
	})
	srv := &http.Server{Addr: "127.0.0.1:8090", Handler: gate.Middleware(tollgate.HTTPOptions{})(mux)}
	_ = srv // srv.ListenAndServe()
}
