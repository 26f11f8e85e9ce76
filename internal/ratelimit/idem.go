package ratelimit

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/quota"
)

// This file is the answer half of idempotency: admit.lua decides and writes
// the record of a first request; the API node stores the answer once it is
// known, or releases the key when the request is refunded (lua/idem.lua).

var idemScript = redis.NewScript(mustRead("idem.lua"))

// StoreAnswer stores the answer of the first request with key (identified by
// its fingerprint fp): later requests with the key are answered with it. It
// reports false when the record is not this request's any more (its lease
// ran out and a newer request took the key).
func (r *Runner) StoreAnswer(ctx context.Context, tenantID, key, fp string, a quota.StoredAnswer) (bool, error) {
	n, err := idemScript.Run(ctx, r.c, []string{r.key(tenantID, "idem2:"+idemHash(key))},
		"store", fp, a.Status, a.Header, a.Body).Int()
	if err != nil {
		return false, fmt.Errorf("ratelimit: store idempotent answer: %w", err)
	}
	return n == 1, nil
}

// ReleaseKey forgets the first request with key (a refunded request did not
// happen: a retry with the key runs again).
func (r *Runner) ReleaseKey(ctx context.Context, tenantID, key, fp string) error {
	err := idemScript.Run(ctx, r.c, []string{r.key(tenantID, "idem2:"+idemHash(key))}, "release", fp).Err()
	if err != nil {
		return fmt.Errorf("ratelimit: release idempotency key: %w", err)
	}
	return nil
}

// Answer reads the stored answer of key.
func (r *Runner) Answer(ctx context.Context, tenantID, key string) (quota.StoredAnswer, error) {
	v, err := r.c.HMGet(ctx, r.key(tenantID, "idem2:"+idemHash(key)), "status", "hdr", "body").Result()
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
