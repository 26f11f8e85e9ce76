package testenv

import (
	"net"
	"testing"
)

// ServeConns listens on a loopback port until the test ends, runs handle
// on each connection in a goroutine of its own and closes the connection
// when handle returns; it returns the host:port. Tests use it for the
// servers they fake (an old Redis, an upstream that hangs up, a webhook
// target that answers garbage).
func ServeConns(tb testing.TB, handle func(net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}
