package ratelimit

import (
	"time"

	"github.com/tollgate/tollgate/internal/quota"
)

// prepaidStale turns the script's "PREPAID <now us>" error (the balance is
// of another period than the script's clock: lua/admit.lua, "Prepaid")
// into a *quota.PrepaidStaleError; other errors are returned as they are.
func prepaidStale(err error) error {
	if us := errorNow(err, "PREPAID "); us > 0 {
		return &quota.PrepaidStaleError{Now: time.UnixMicro(us).UTC()}
	}
	return err
}
