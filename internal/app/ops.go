package app

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
)

// opsServer serves the operations app (*httpapi.Server).
type opsServer interface {
	ServeOps(ln net.Listener) error
	ShutdownOps(timeout time.Duration) error
}

// opsListener serves the operations app (/metrics, /readyz with its
// checks) on TOLLGATE_OPS_ADDR, when it is set.
type opsListener struct {
	srv  opsServer
	done chan error // the app's Listener's end
}

// serveOps listens on addr and serves the operations app of srv there;
// with no addr it serves nothing, and its failed channel never delivers.
func serveOps(addr string, srv opsServer, log *slog.Logger) (*opsListener, error) {
	o := &opsListener{srv: srv}
	if addr == "" {
		return o, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("TOLLGATE_OPS_ADDR: listen %s: %w", addr, err)
	}
	log.Info("operations listening", "addr", ln.Addr().String())
	o.done = make(chan error, 1)
	go func() { o.done <- srv.ServeOps(ln) }()
	return o, nil
}

// failed delivers the error the listener stopped with before shutdown; nil
// (blocks forever) without a listener.
func (o *opsListener) failed() <-chan error { return o.done }

// shutdown stops the listener, within timeout, and waits for it.
func (o *opsListener) shutdown(timeout time.Duration, log *slog.Logger) error {
	if o.done == nil {
		return nil
	}
	if err := o.srv.ShutdownOps(timeout); err != nil {
		log.Warn("operations listener shutdown timed out", "err", err)
	}
	if err := <-o.done; err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("api: operations listener: %w", err)
	}
	return nil
}
