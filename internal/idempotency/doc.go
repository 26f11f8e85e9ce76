// Package idempotency owns the answer half of idempotency in Redis:
// internal/ratelimit's admission decides and writes the record of a first
// request; this package stores its answer once known (StoreAnswer), reads
// it back for a repeat (Answer), releases the key of a refunded request
// (ReleaseKey), and bounds each tenant's records in number and bytes
// (quota.AnswerLimits: ClaimAnswer, UnclaimAnswer, AnswerUsage).
//
// It must not decide admissions or count usage: a record's decision is
// the admission's (lua/admit.lua). Its calls go through internal/redisfn.
package idempotency

import (
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// Answers keeps the idempotent answers of one Redis store. It is safe for
// concurrent use once its limits are set.
type Answers struct {
	*redisfn.Store
	// answers bound each tenant's idempotency records (idem.go)
	answers quota.AnswerLimits
}

// New returns the answers of s, bound by quota.DefaultAnswerLimits.
func New(s *redisfn.Store) *Answers {
	return &Answers{Store: s, answers: quota.DefaultAnswerLimits}
}
