//go:build !linux

package httpapi

import "syscall"

// gone reports whether the client of socket fd closed or reset it, by
// peeking (MSG_PEEK: nothing is read). Without Linux's POLLRDHUP a close
// behind bytes the client left unread is not seen: such a waiter stays
// until its max wait.
func (h *hangup) gone(fd int) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		return false
	case err != nil:
		return true // reset
	}
	return n == 0
}
