package quota

import (
	"bytes"
	"encoding/json"
	"errors"
)

// Optional is a JSON field that tells "absent" from "null": Set is true when
// the field was present, and Value is nil when it was null.
type Optional[T any] struct {
	Set   bool
	Value *T
}

// IsZero reports whether the field is absent, for json's omitzero.
func (o Optional[T]) IsZero() bool { return !o.Set }

// MarshalJSON writes the value, or null.
func (o Optional[T]) MarshalJSON() ([]byte, error) { return json.Marshal(o.Value) }

// UnmarshalJSON marks the field present and reads its value or null.
func (o *Optional[T]) UnmarshalJSON(b []byte) error {
	o.Set = true
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		o.Value = nil
		return nil
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	o.Value = &v
	return nil
}

// Set returns an Optional holding v (nil means "override to unlimited").
func Set[T any](v *T) Optional[T] { return Optional[T]{Set: true, Value: v} }

// Overrides replace some of a tier's limits for one tenant. An absent field
// keeps the tier's limit; a field set to null makes that limit unlimited.
type Overrides struct {
	BurstRate          Optional[float64] `json:"burst_rate,omitzero"`
	Burst              Optional[int64]   `json:"burst,omitzero"`
	BucketCapacity     Optional[int64]   `json:"bucket_capacity,omitzero"`
	BucketRefillPerSec Optional[float64] `json:"bucket_refill_per_sec,omitzero"`
	DailyQuota         Optional[int64]   `json:"daily_quota,omitzero"`
	MonthlyQuota       Optional[int64]   `json:"monthly_quota,omitzero"`
	MaxOverageCents    Optional[int64]   `json:"max_overage_cents,omitzero"`
}

func pick[T any](o Optional[T], tier *T) *T {
	if o.Set {
		return o.Value
	}
	return tier
}

// Apply returns the tier's limits l with the overrides applied.
func (o Overrides) Apply(l Limits) Limits {
	return Limits{
		BurstRate:          pick(o.BurstRate, l.BurstRate),
		Burst:              pick(o.Burst, l.Burst),
		BucketCapacity:     pick(o.BucketCapacity, l.BucketCapacity),
		BucketRefillPerSec: pick(o.BucketRefillPerSec, l.BucketRefillPerSec),
		DailyQuota:         pick(o.DailyQuota, l.DailyQuota),
		MonthlyQuota:       pick(o.MonthlyQuota, l.MonthlyQuota),
		MaxOverageCents:    pick(o.MaxOverageCents, l.MaxOverageCents),
	}
}

// OverridesError names an error of limits made with a tenant's overrides
// as the override's field (overrides.<field>), so that it points at what
// the caller sent; other errors are returned as they are.
func OverridesError(err error) error {
	var e *Error
	if errors.As(err, &e) && e.Field != "" {
		return &Error{Code: e.Code, Field: "overrides." + e.Field, Message: e.Message}
	}
	return err
}
