package httpapi

import (
	"math"

	"golang.org/x/sys/unix"
)

// gone reports whether the client of socket fd is gone: poll's POLLRDHUP
// reports its close (POLLHUP, POLLERR a reset) even behind bytes it sent
// that are still unread. When h.drain, those bytes are read and dropped
// first, so that a close behind more of them than the socket's buffer
// holds can arrive; past hangupUnread of them the client is gone too.
func (h *hangup) gone(fd int) bool {
	if fd < 0 || fd > math.MaxInt32 {
		return false // no socket's
	}
	p := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	if n, err := unix.Poll(p[:], 0); err != nil || n == 0 {
		return false
	}
	if p[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
		return true
	}
	if !h.drain || p[0].Revents&unix.POLLIN == 0 {
		return false
	}
	if h.scratch == nil {
		h.scratch = make([]byte, 4096)
	}
	for {
		n, err := unix.Read(fd, h.scratch)
		switch {
		case n > 0:
			h.drained += n
			if h.drained > hangupUnread {
				return true
			}
		case err == unix.EINTR:
		case err == unix.EAGAIN:
			return false
		default:
			return true // end of stream (n == 0), or a reset
		}
	}
}
