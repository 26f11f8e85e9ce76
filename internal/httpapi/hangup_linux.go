package httpapi

import "golang.org/x/sys/unix"

// peerClosed reports whether the peer of the socket fd closed its side
// (or reset it): poll's POLLRDHUP reports the peer's FIN even when bytes
// it sent before are still unread, which a peek cannot see past. Nothing
// is read.
func peerClosed(fd uintptr) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0 && p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
}
