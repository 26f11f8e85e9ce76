package httpapi

import (
	"context"
	"net"
	"time"

	"github.com/gofiber/fiber/v2"
)

const (
	// hangupPoll is how often a waiting request checks that its client is
	// still there.
	hangupPoll = 20 * time.Millisecond
	// hangupUnread bounds what a client may send behind its request while
	// the request waits: past it the client is taken as gone.
	hangupUnread = 64 << 10
)

// hangup is what the watch of one connection keeps (hangup_*.go).
type hangup struct {
	// drain: what the client sends behind its request may be read and
	// dropped (its body is not streamed from the connection)
	drain   bool
	drained int // bytes read and dropped
	scratch []byte
}

// untilHangup returns a context that ends with the request's own or when
// the client is gone: a request waiting in a policy queue (or for its
// leaky_bucket slot) leaves the queue when its client hung up. fasthttp
// does not notice a peer's close while a handler runs, so the socket is
// asked every hangupPoll, until stop is called, whether the peer closed or
// reset it (hangup.gone). Bytes the client sent behind its request would
// hide a close behind them (once they fill the socket's buffer, the close
// cannot even arrive): they are read and dropped, and past hangupUnread
// the client is taken as gone. A connection that lost bytes that way is
// closed after the answer (stop), so that nothing is parsed from the gap;
// a client that pipelined requests retries those left unanswered, as HTTP
// allows.
func untilHangup(c *fiber.Ctx) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(c.UserContext())
	tcp, ok := c.Context().Conn().(*net.TCPConn)
	if !ok {
		return ctx, cancel
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return ctx, cancel
	}
	h := &hangup{drain: !c.Request().IsBodyStream()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(hangupPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			gone := false
			if raw.Control(func(fd uintptr) { gone = h.gone(int(fd)) }) != nil || gone {
				cancel()
				return
			}
		}
	}()
	return ctx, func() {
		cancel()
		<-done // (h is the watch's until then)
		if h.drained > 0 {
			c.Context().SetConnectionClose()
		}
	}
}
