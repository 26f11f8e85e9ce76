package httpapi

import (
	"context"
	"net"
	"time"

	"github.com/gofiber/fiber/v2"
)

// hangupPoll is how often a waiting request checks that its client is
// still there.
const hangupPoll = 20 * time.Millisecond

// untilHangup returns a context that ends with the request's own or when
// the client closes its connection: a request waiting in a policy queue
// (or for its leaky_bucket slot) leaves the queue when its client hung up.
// fasthttp does not notice a peer's close while a handler runs, so the
// socket is asked every hangupPoll, until stop is called, whether the peer
// closed it (peerClosed): whatever the client sent after its request and
// left unread, a close is seen, and the bytes stay where they are for
// fasthttp (a pipelined next request).
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
	go func() {
		t := time.NewTicker(hangupPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			closed := false
			if raw.Control(func(fd uintptr) { closed = peerClosed(fd) }) != nil || closed {
				cancel()
				return
			}
		}
	}()
	return ctx, cancel
}
