//go:build !linux

package httpapi

import "syscall"

// peerClosed reports whether the peer of the socket fd closed or reset
// it, by peeking (MSG_PEEK: nothing is consumed). Without Linux's
// POLLRDHUP a close behind bytes the client left unread is not seen until
// they are read: such a waiter stays until its max wait.
func peerClosed(fd uintptr) bool {
	var b [1]byte
	n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR:
		return false
	case err != nil:
		return true // reset
	}
	return n == 0
}
