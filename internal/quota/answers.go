package quota

import "time"

// The room a tenant's idempotency records take in Redis. Each record lives
// 24 hours and may hold an answer of up to MaxAnswerBody + MaxAnswerHeader
// bytes, so that without a bound a tenant's keys could hold any amount of
// memory. AnswerLimits bound, per tenant, the records that live and the
// bytes of their answers; a new key that would pass either is refused
// before it runs (IdemLimit), consuming nothing.

// MaxAnswerBody is the largest answer body stored for idempotent repeats;
// a larger answer is sent as usual and recorded as too large (its repeats
// are 409: running the request again is what the key forbids).
const MaxAnswerBody = 1 << 20

// MaxAnswerHeader bounds the stored headers of an answer ("Name: value"
// lines); an answer whose headers are longer is recorded as too large too.
const MaxAnswerHeader = 16 << 10

// AnswerReserve is the room a request in flight holds until its answer is
// stored (then the answer's own size): the largest answer it may store,
// so that an admitted request always has room for its answer.
const AnswerReserve = MaxAnswerBody + MaxAnswerHeader

// AnswerLimits bound a tenant's idempotency records: at most Answers
// records live (stored answers, and first requests in flight, which hold
// AnswerReserve bytes until their answer is stored), holding at most Bytes
// bytes of answers (body and stored headers). A record frees its room
// when it expires, 24 hours after its first request.
type AnswerLimits struct {
	Answers int64
	Bytes   int64
}

// DefaultAnswerLimits are the limits of TOLLGATE_IDEMPOTENCY_MAX_ANSWERS
// and TOLLGATE_IDEMPOTENCY_MAX_BYTES when unset.
var DefaultAnswerLimits = AnswerLimits{Answers: 100_000, Bytes: 64 << 20}

// AnswerUsage is a tenant's room for idempotency records as it stands:
// the records and bytes held, and the limits.
type AnswerUsage struct {
	Answers int64
	Bytes   int64
	Limits  AnswerLimits
}

// ClaimStatus is what a claim on a tenant's room for idempotency records
// did.
type ClaimStatus int8

const (
	// ClaimSkipped means a live record of the key answers the request (a
	// replay, in flight or another request): it writes no record and
	// takes no room.
	ClaimSkipped ClaimStatus = iota
	// ClaimTaken means the request holds the room of one record.
	ClaimTaken
	// ClaimRefused means the room is full; nothing was taken.
	ClaimRefused
)

// AnswerClaim is the outcome of a claim: its status, the wait until the
// records' expiries make room (ClaimRefused), and the room after it.
type AnswerClaim struct {
	Status     ClaimStatus
	RetryAfter time.Duration
	Usage      AnswerUsage
}
