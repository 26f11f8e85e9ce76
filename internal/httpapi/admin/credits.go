package admin

import (
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// creditCreate is the body of POST /admin/v1/tenants/{id}/credits.
// expires_at is read as a string so that a malformed time is an error
// naming the field.
type creditCreate struct {
	AmountCents *int64  `json:"amount_cents"`
	Reason      *string `json:"reason"`
	ExpiresAt   *string `json:"expires_at"`
}

// credit returns the credit the body asks for; the ledger checks its values.
func (b creditCreate) credit() (billing.NewCredit, error) {
	var c billing.NewCredit
	var err error
	if c.AmountCents, err = required("amount_cents", b.AmountCents); err != nil {
		return c, err
	}
	if c.Reason, err = required("reason", b.Reason); err != nil {
		return c, err
	}
	if b.ExpiresAt != nil {
		t, err := time.Parse(time.RFC3339, *b.ExpiresAt)
		if err != nil {
			return c, quota.FieldError("expires_at", "must be an RFC 3339 time, such as 2027-01-01T00:00:00Z")
		}
		c.ExpiresAt = &t
	}
	return c, nil
}

// CreateCredit grants prepaid credit to a tenant: 201 with the ledger's
// grant entry; 200 with the credit first recorded for a repeat of its
// Idempotency-Key (answered even once the credit's expiry has passed).
func (s *API) CreateCredit(c *fiber.Ctx) error {
	key, err := httpx.IdempotencyKey(c)
	if err != nil {
		return err
	}
	var body creditCreate
	if err := httpx.DecodeJSON(c, &body); err != nil {
		return err
	}
	in, err := body.credit()
	if err != nil {
		return err
	}
	e, isNew, err := s.ledger.CreateCredit(c.UserContext(), adminActor, c.Params("id"), key, in, s.now())
	if err != nil {
		return err
	}
	if isNew {
		s.catalog.Credited(c.UserContext(), e.TenantID)
	}
	if !isNew {
		c.Set("Idempotent-Replayed", "true")
		return c.JSON(e)
	}
	return created(c, "/admin/v1/tenants/"+e.TenantID+"/credits/"+e.ID, e)
}

// GetCredit answers one credit granted to a tenant, as its ledger lists it.
func (s *API) GetCredit(c *fiber.Ctx) error {
	tenantID, id := c.Params("id"), c.Params("credit")
	if err := validID("credit", id); err != nil {
		return err
	}
	e, err := s.ledger.Credit(c.UserContext(), tenantID, id)
	if err != nil {
		return err
	}
	return c.JSON(e)
}

// ListCredits answers a page of the tenant's credit ledger, newest first,
// with its balance now: {items, next_cursor, balance_cents}.
func (s *API) ListCredits(c *fiber.Ctx) error {
	p, err := page(c)
	if err != nil {
		return err
	}
	out, err := s.ledger.Credits(c.UserContext(), c.Params("id"), s.now(), p)
	if err != nil {
		return err
	}
	return c.JSON(out)
}
