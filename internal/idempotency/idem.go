package idempotency

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/redisfn"
)

// This file is the answer half of idempotency: admit.lua decides and writes
// the record of a first request; the API node stores the answer once it is
// known, or releases the key when the request is refunded (lua/idem.lua).
// It also keeps each tenant's room for records (quota.AnswerLimits): a
// request that may write a record claims its room before its admission
// (ClaimAnswer), and gives the claim back when it wrote none
// (UnclaimAnswer); storing or releasing the answer settles the claim.

// WithAnswerLimits sets the room of each tenant's idempotency records
// (quota.DefaultAnswerLimits unless set) and returns r.
func (r *Answers) WithAnswerLimits(l quota.AnswerLimits) *Answers {
	r.answers = l
	return r
}

// idemKeys are lua/idem.lua's KEYS: the tenant's room, then the record of
// key ("" for none: the room alone).
func (r *Answers) idemKeys(tenantID, key string) []string {
	keys := []string{r.Key(tenantID, "idemroom"), r.Key(tenantID, "idembytes")}
	if key != "" {
		keys = append(keys, r.Key(tenantID, "idem2:"+redisfn.IdemHash(key)))
	}
	return keys
}

// millis is t in ms since the epoch, or 0 (Redis TIME) for the zero time.
func millis(t time.Time) int64 { return redisfn.Micros(t) / 1000 }

// reserve is the room a request's record holds until its answer is
// stored: the largest answer, unless its decision is the answer (no lease:
// POST /v1/check), which stores nothing more.
func reserve(req quota.Request) int64 {
	if req.IdempotencyLease > 0 {
		return quota.AnswerReserve
	}
	return 0
}

func checkClaim(req quota.Request) error {
	if err := redisfn.CheckTenant(req.TenantID); err != nil {
		return err
	}
	if req.IdempotencyKey == "" || req.IdempotencyClaim == "" || len(req.IdempotencyClaim) > 64 {
		return quota.FieldError("idempotency", "a claim needs the key and a claim id of 1 to 64 characters")
	}
	return redisfn.CheckNow(req.Now)
}

// ClaimAnswer takes the room of the record that req (with an idempotency
// key and a claim id) may write, before its admission: ClaimTaken, or
// ClaimRefused with the wait until the records' expiries make room, when
// the tenant's records would pass the runner's AnswerLimits; ClaimSkipped
// when a live record of the key will answer the request (a replay, 409 or
// 422), which writes none. With force, the room is taken whatever the
// limits: for an admission that wrote a record after its claim was
// skipped (the deciding record went in between).
func (r *Answers) ClaimAnswer(ctx context.Context, req quota.Request, force bool) (quota.AnswerClaim, error) {
	if err := checkClaim(req); err != nil {
		return quota.AnswerClaim{}, err
	}
	keys := r.idemKeys(req.TenantID, req.IdempotencyKey)
	if force {
		if err := r.Call(ctx, redisfn.FnIdem, keys, "count", millis(req.Now), req.IdempotencyClaim,
			req.IdempotencyFingerprint, reserve(req)).Err(); err != nil {
			return quota.AnswerClaim{}, fmt.Errorf("ratelimit: count an idempotency record: %w", err)
		}
		return quota.AnswerClaim{Status: quota.ClaimTaken}, nil
	}
	res, err := r.Call(ctx, redisfn.FnIdem, keys, "claim", millis(req.Now), req.IdempotencyClaim,
		req.IdempotencyFingerprint, reserve(req), r.answers.Answers, r.answers.Bytes).Int64Slice()
	if err != nil {
		return quota.AnswerClaim{}, fmt.Errorf("ratelimit: claim an idempotency record: %w", err)
	}
	if len(res) != 4 {
		return quota.AnswerClaim{}, fmt.Errorf("ratelimit: claim an idempotency record: script answered %d values, want 4", len(res))
	}
	c := quota.AnswerClaim{Usage: quota.AnswerUsage{Answers: res[2], Bytes: res[3], Limits: r.answers}}
	switch res[0] {
	case 1:
		c.Status = quota.ClaimTaken
	case 0:
		c.Status = quota.ClaimSkipped
	default:
		c.Status, c.RetryAfter = quota.ClaimRefused, time.Duration(res[1])*time.Millisecond
	}
	return c, nil
}

// UnclaimAnswer gives back the room req claimed: its admission wrote no
// record.
func (r *Answers) UnclaimAnswer(ctx context.Context, req quota.Request) error {
	if err := checkClaim(req); err != nil {
		return err
	}
	err := r.Call(ctx, redisfn.FnIdem, r.idemKeys(req.TenantID, req.IdempotencyKey), "unclaim", millis(req.Now),
		req.IdempotencyClaim, req.IdempotencyFingerprint).Err()
	if err != nil {
		return fmt.Errorf("ratelimit: give back an idempotency claim: %w", err)
	}
	return nil
}

// AnswerUsage reports the room the tenant's idempotency records hold, and
// the limits.
func (r *Answers) AnswerUsage(ctx context.Context, tenantID string) (quota.AnswerUsage, error) {
	if err := redisfn.CheckTenant(tenantID); err != nil {
		return quota.AnswerUsage{}, err
	}
	res, err := r.Call(ctx, redisfn.FnIdem, r.idemKeys(tenantID, ""), "room", 0).Int64Slice()
	if err != nil {
		return quota.AnswerUsage{}, fmt.Errorf("ratelimit: idempotency room: %w", err)
	}
	if len(res) != 2 {
		return quota.AnswerUsage{}, fmt.Errorf("ratelimit: idempotency room: script answered %d values, want 2", len(res))
	}
	return quota.AnswerUsage{Answers: res[0], Bytes: res[1], Limits: r.answers}, nil
}

// StoreAnswer stores the answer of the first request req (its key, its
// fingerprint and its claim): later requests with the key are answered
// with it, and the claim holds the answer's size until the record
// expires. It reports false when the record is not this request's any
// more (its lease ran out and a newer request took the key); its claim is
// given back then. An answer larger than quota.AnswerReserve is an error.
func (r *Answers) StoreAnswer(ctx context.Context, req quota.Request, a quota.StoredAnswer) (bool, error) {
	if err := checkClaim(req); err != nil {
		return false, err
	}
	n, err := r.Call(ctx, redisfn.FnIdem, r.idemKeys(req.TenantID, req.IdempotencyKey), "store", millis(req.Now),
		req.IdempotencyClaim, req.IdempotencyFingerprint, a.Status, a.Header, a.Body, quota.AnswerReserve).Int()
	if err != nil {
		return false, fmt.Errorf("ratelimit: store idempotent answer: %w", err)
	}
	return n == 1, nil
}

// ReleaseKey forgets the first request req (a refunded request did not
// happen: a retry with the key runs again), and gives back its claim.
func (r *Answers) ReleaseKey(ctx context.Context, req quota.Request) error {
	if err := checkClaim(req); err != nil {
		return err
	}
	err := r.Call(ctx, redisfn.FnIdem, r.idemKeys(req.TenantID, req.IdempotencyKey), "release", millis(req.Now),
		req.IdempotencyClaim, req.IdempotencyFingerprint).Err()
	if err != nil {
		return fmt.Errorf("ratelimit: release idempotency key: %w", err)
	}
	return nil
}

// Answer reads the stored answer of key.
func (r *Answers) Answer(ctx context.Context, tenantID, key string) (quota.StoredAnswer, error) {
	v, err := r.Client().HMGet(ctx, r.Key(tenantID, "idem2:"+redisfn.IdemHash(key)), "status", "hdr", "body").Result()
	if err != nil {
		return quota.StoredAnswer{}, fmt.Errorf("ratelimit: read idempotent answer: %w", err)
	}
	status, _ := v[0].(string)
	code, err := strconv.Atoi(status)
	if err != nil {
		return quota.StoredAnswer{}, quota.ErrNoAnswer
	}
	hdr, _ := v[1].(string)
	body, _ := v[2].(string)
	return quota.StoredAnswer{Status: code, Header: hdr, Body: []byte(body)}, nil
}
