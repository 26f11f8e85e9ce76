package tollgate

import (
	"net/http"
)

// HTTPOptions name what a request of the net/http middleware counts.
type HTTPOptions struct {
	// Meter returns the meter of r; nil or "": the Gate's Meter.
	Meter func(r *http.Request) string
	// Cost returns the cost of r; nil or 0: the Gate's Cost.
	Cost func(r *http.Request) int64
}

// Middleware admits each request through the Gate before next serves it.
// The API key comes from Authorization: Bearer or X-API-Key. Every answer
// carries the quota headers Tollgate answered; a refusal is answered with
// Tollgate's status, headers and body unchanged (or from the deny cache
// until its Retry-After passes), and next is not called. An admitted
// request's Admission is in its context (AdmissionFrom).
func (g *Gate) Middleware(opts HTTPOptions) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var meter string
			var cost int64
			if opts.Meter != nil {
				meter = opts.Meter(r)
			}
			if opts.Cost != nil {
				cost = opts.Cost(r)
			}
			key := APIKeyOf(r.Header.Get("Authorization"), r.Header.Get("X-API-Key"))
			a := g.Admit(r.Context(), key, meter, cost, r.URL.Path)
			if !a.Allowed {
				a.WriteTo(w)
				return
			}
			for k, v := range a.Header {
				w.Header().Set(k, v)
			}
			sw := &statusWriter{ResponseWriter: w}
			defer func() {
				if v := recover(); v != nil {
					g.Finish(r.Context(), a, http.StatusInternalServerError)
					panic(v)
				}
				g.Finish(r.Context(), a, sw.Status())
			}()
			next.ServeHTTP(sw, r.WithContext(WithAdmission(r.Context(), a)))
		})
	}
}

// statusWriter notes the status a handler answers.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Status is the status answered (200 when the handler wrote nothing).
func (w *statusWriter) Status() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Unwrap lets http.ResponseController reach the writer beneath.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
