package httpapi

import (
	"context"
	"net"
	"syscall"
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
// connection is peeked (MSG_PEEK: the bytes of a pipelined next request
// stay where they are) every hangupPoll until stop is called.
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
		var b [1]byte
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			closed := false
			_ = raw.Read(func(fd uintptr) bool {
				n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
				closed = n == 0 && err == nil
				return true // never wait for data: this is a probe
			})
			if closed {
				cancel()
				return
			}
		}
	}()
	return ctx, cancel
}
