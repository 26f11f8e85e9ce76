package httpapi

import (
	"context"
	"net"
	"sync"
	"syscall"
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

// hangupWatch watches one waiting request's connection (untilHangup).
type hangupWatch struct {
	c      *fiber.Ctx
	h      hangup
	cancel context.CancelFunc
	done   chan struct{} // closed when the watch ended
	once   sync.Once
}

// untilHangup returns a context that ends with the request's own or when
// the client is gone, watched until end (or finish) is called: a request
// waiting in a policy queue (or for its leaky_bucket slot) leaves the
// queue when its client hung up. fasthttp does not notice a peer's close
// while a handler runs, so the socket is asked every hangupPoll whether
// the peer closed or reset it (hangup.gone). Bytes the client sent behind
// its request would hide a close behind them (once they fill the socket's
// buffer, the close cannot even arrive): they are read and dropped, and
// past hangupUnread the client is taken as gone. A connection that lost
// bytes that way is closed after the answer (finish), so that nothing is
// parsed from the gap; a client that pipelined requests retries those left
// unanswered, as HTTP allows.
func untilHangup(c *fiber.Ctx) (context.Context, *hangupWatch) {
	ctx, cancel := context.WithCancel(c.UserContext())
	w := &hangupWatch{c: c, h: hangup{drain: !c.Request().IsBodyStream()}, cancel: cancel, done: make(chan struct{})}
	tcp, ok := c.Context().Conn().(*net.TCPConn)
	var raw syscall.RawConn
	if ok {
		var err error
		raw, err = tcp.SyscallConn()
		ok = err == nil
	}
	if !ok {
		close(w.done)
		return ctx, w
	}
	go func() {
		defer close(w.done)
		t := time.NewTicker(hangupPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			gone := false
			if raw.Control(func(fd uintptr) { gone = w.h.gone(int(fd)) }) != nil || gone {
				cancel()
				return
			}
		}
	}()
	return ctx, w
}

// end ends the watch (and its context): the request waits no more, and
// what its client sends from now on is fasthttp's. A nil watch does
// nothing.
func (w *hangupWatch) end() {
	if w == nil {
		return
	}
	w.once.Do(func() {
		w.cancel()
		<-w.done // (w.h is the watch's until then)
	})
}

// finish ends the watch, and has the connection closed after the answer
// when the watch dropped bytes of it. Call it when the answer is made.
func (w *hangupWatch) finish() {
	if w == nil {
		return
	}
	w.end()
	if w.h.drained > 0 {
		w.c.Context().SetConnectionClose()
	}
}
