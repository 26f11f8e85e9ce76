package httpapi

import (
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/valyala/bytebufferpool"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/admission"
)

// Upstream answers are streamed to the client: the proxy holds at most
// bufferedAnswer bytes of one, whatever its size, and reads the upstream no
// faster than the client takes the answer. fasthttp's client (with
// StreamResponseBody and MaxResponseBodySize at bufferedAnswer) reads an
// answer of known length up to bufferedAnswer whole, as before; a longer
// one, or a chunked one, comes as a stream the server copies to the client
// after the handler returns, through upstreamBody. An answer whose end is
// the upstream closing the connection (no Content-Length, not chunked) is
// read whole too: past bufferedAnswer it is ErrBodyTooLarge, a 502.
//
// An optional maximum (Options.MaxResponseBytes) refuses longer answers:
// one whose Content-Length passes it is a 502 before anything is sent; a
// chunked one that passes it is cut there (the status and headers are gone
// by then), and the client sees the connection end before the body does.
const bufferedAnswer = admission.MaxReplayBody

// defaultAnswerHeader is the largest header block of an answer the proxy
// reads unless told otherwise (TOLLGATE_PROXY_MAX_RESPONSE_HEADER_BYTES).
const defaultAnswerHeader = 64 << 10

// newUpstreamClient is the client of every proxied route of a server; each
// call bounds itself with the route's timeout, which also bounds the
// reading of a streamed body (the connection's read deadline holds until it
// is closed). DisablePathNormalizing sends the target's path as
// routes.Target built it: fasthttp would otherwise unescape it (a%2Fb
// becomes a/b), resolve its dot segments and escape it again.
//
// An answer's status line and headers must fit the connection's read
// buffer, so ReadBufferSize is the header limit (maxHeader; fasthttp's own
// default is 4 KiB). A request is sent again only when its connection
// closed before a byte of answer came (a pooled connection the upstream
// had closed): never after an answer began, which the upstream may have
// done the work for, whatever the method (RetryIf; fasthttp would resend
// a GET, HEAD or PUT after any failure, up to five times).
func newUpstreamClient(maxAnswer int64, maxHeader int) *fasthttp.Client {
	buffered := bufferedAnswer
	if maxAnswer > 0 && maxAnswer < int64(buffered) {
		buffered = int(maxAnswer)
	}
	if maxHeader <= 0 {
		maxHeader = defaultAnswerHeader
	}
	return &fasthttp.Client{
		ReadBufferSize:           maxHeader,
		RetryIf:                  func(*fasthttp.Request) bool { return false },
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		MaxConnsPerHost:          1024,
		ReadTimeout:              10 * time.Minute,
		WriteTimeout:             time.Minute,
		MaxIdleConnDuration:      30 * time.Second,
		StreamResponseBody:       true,
		MaxResponseBodySize:      buffered,
	}
}

// errAnswerTooLarge cuts a streamed answer at the maximum.
var errAnswerTooLarge = errors.New("httpapi: the upstream's answer passed TOLLGATE_PROXY_MAX_RESPONSE_BYTES; cut")

// upstreamBody is a streamed upstream answer as the client's response body.
// It holds the upstream's response (and so its connection) until the server
// has copied it and closes it.
type upstreamBody struct {
	up *fasthttp.Response
	r  io.Reader // up's body stream
	// prefix was read ahead (an idempotent answer, to learn whether it fits
	// MaxReplayBody) and is sent first.
	prefix *bytebufferpool.ByteBuffer
	off    int
	// size is the body's Content-Length (prefix aside), -1 when chunked;
	// read counts what r gave, and left what the maximum still allows (-1:
	// no maximum).
	size, read, left int64
	done             bool // r is at its end: the connection may serve again
	cut              bool // the maximum was reached: no more is read
	log              *slog.Logger
	meter            string
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	if b.cut {
		return 0, errAnswerTooLarge
	}
	if b.prefix != nil && b.off < len(b.prefix.B) {
		n := copy(p, b.prefix.B[b.off:])
		b.off += n
		return n, nil
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	if err == io.EOF || b.read == b.size {
		b.done = true
	}
	if b.left >= 0 {
		if int64(n) > b.left {
			// The server writes what it is given with an error, then
			// stops: the client gets the maximum, and no end of body.
			b.log.Warn("an upstream's answer passed TOLLGATE_PROXY_MAX_RESPONSE_BYTES; the client's connection is cut there", "meter", b.meter)
			n, b.left, b.done, b.cut = int(b.left), 0, false, true
			return n, errAnswerTooLarge
		}
		b.left -= int64(n)
	}
	return n, err
}

// Close ends the upstream exchange: a connection whose answer was not read
// to its end (the client went away, or the maximum cut it) is closed, never
// given back to the pool with the rest of an answer waiting on it.
func (b *upstreamBody) Close() error {
	if !b.done {
		b.up.SetConnectionClose() // read by fasthttp's closing of the stream
	}
	err := b.up.CloseBodyStream()
	fasthttp.ReleaseResponse(b.up)
	if b.prefix != nil {
		bytebufferpool.Put(b.prefix)
	}
	return err
}
