package quota

import (
	"fmt"
	"time"
)

// Billing says how a tier's tenants pay for their usage.
type Billing string

const (
	// BillingPostpaid bills the period's usage on its invoice, after the
	// fact (credits, if any, pay the invoice when it becomes final).
	BillingPostpaid Billing = "postpaid"
	// BillingPrepaid admits a unit past the included monthly quota only
	// while the tenant's credit covers it: its cost is drawn down at
	// admission, in the same atomic decision as the limits, and an
	// exhausted balance refuses with 402 (LimitCredit). A prepaid tier
	// bills overage (the units past the monthly quota, at the tier's and
	// the meters' overage prices) and has no subscription price: its
	// invoices are its overage lines, paid by the credit lines that the
	// admissions reserved.
	BillingPrepaid Billing = "prepaid"
)

// LimitCredit names the refusal of a prepaid tenant's request whose cost
// the credit balance does not cover (402, problem type credit-exhausted).
// Like LimitSpendCap it is no limit of AllLimits: only a name in Violated.
const LimitCredit LimitName = "credit"

// checkBilling validates a tier's billing mode and what prepaid needs of
// the rest of the tier.
func (t Tier) checkBilling() error {
	switch t.Billing {
	case BillingPostpaid, "":
	case BillingPrepaid:
		switch {
		case t.Overage != OverageBill:
			return FieldError("billing", `a prepaid tier must have overage "bill": its units past the monthly quota are paid from the credit`)
		case t.MonthlyQuota == nil:
			return FieldError("billing", "a prepaid tier must have a monthly quota (0 for none included): the units past it are paid from the credit")
		case t.PriceCents != 0:
			return FieldError("price_cents", "must be 0 for a prepaid tier: its tenants pay for their units from their credit")
		case t.TopUpURL == "":
			return FieldError("top_up_url", "is required for a prepaid tier: a refused request points there")
		}
	default:
		return FieldError("billing", `must be "postpaid" or "prepaid"`)
	}
	if len(t.TopUpURL) > MaxURLLength {
		return FieldError("top_up_url", "must be at most %d characters", MaxURLLength)
	}
	return nil
}

// CheckOverrides validates the limits of a tenant of t with the overrides
// o (Limits.Validate of o.Apply(t.Limits)); on a prepaid tier the monthly
// quota must stay limited, since the units past it are what the credit
// pays for (an unlimited one would make every unit free).
func (t Tier) CheckOverrides(o Overrides) error {
	l := o.Apply(t.Limits)
	if err := l.Validate(); err != nil {
		return err
	}
	if t.IsPrepaid() && l.MonthlyQuota == nil {
		return FieldError("monthly_quota", "must not be unlimited on a prepaid tier: the units past it are paid from the credit")
	}
	return nil
}

// Prepaid is what a prepaid tenant's admissions may draw on in one billing
// period. Its credit is Postgres's (the ledger); what admissions drew and
// no invoice has drawn yet is Redis's, counted by the admission script
// per period (lua/admit.lua, "Prepaid"), so that concurrent admissions on
// every node draw on one balance, atomically.
//
// The balance an admission checks is
//
//	BalanceMillicents >= drawn(PeriodID) + 999 × (Lines - 1)
//	                     + max(0, drawn(PrevID) + 999 × Lines - ExpiringMillicents)
//	                     + this request's cost
//
// where drawn(p) is the cost (units past the monthly quotas × the overage
// prices, in millicents) of the admissions of period p, PrevID the period
// before PeriodID while its invoice is not final (0 once it is: then its
// draws are on the ledger, out of the credit), and the max term counts
// only while PrevID is set and that period drew anything; 999 millicents
// are kept back for each invoice line past the first that may round up to
// the cent. The invoicing side (billing.Ledger.Prepaid) computes the
// fields by the rules its invoices draw credits by.
type Prepaid struct {
	// BalanceMillicents is what the period's invoice will be able to draw
	// (the credit that pays it: granted before the period's end and not
	// expired before it), in millicents, once every invoice not final yet
	// has drawn its share, less the charges of the period's own invoice
	// that admissions do not draw (a postpaid plan's price before a move
	// onto the tier, say). What the admissions of this period and the
	// previous one drew is Redis's, and not in it. It may be negative.
	BalanceMillicents int64
	// Lines is how many invoice lines of a period the draws are rated on:
	// the tier's overage and each billed meter quota's. Each is rounded up
	// to the cent, so the script keeps 999 millicents back per line past
	// the first that the current and the previous period may have: a
	// balance that admits never leaves an invoice more than its credit.
	Lines int
	// CreditCents is the credit that pays the period's invoice, in cents,
	// left by the final invoices, before the deductions.
	CreditCents int64
	// PeriodID is the billing period the balance is for (Calendar.PeriodID)
	// and Until its end: the balance is stale from then.
	PeriodID int
	Until    time.Time
	// PrevID is the previous period while its invoice is not final, else 0.
	PrevID int
	// ExpiringMillicents, while PrevID is set, is what the previous
	// period's draws (with their rounding reserve) may reach before they
	// take anything off the balance, in millicents: the credit that
	// invoice draws first, which does not pay this period's (it expires
	// before this period's end), less its charges that are not drawn at
	// admission; or its overage charges as the ledger rates them, when
	// more (the balance already holds those back: that invoice takes the
	// more of them and of what Redis counts); or 2^53, more than any draws
	// reach, when that invoice takes all the credit it shares with this
	// period's whatever it drew.
	ExpiringMillicents int64
	// HeldCents is what the invoices not final yet take off CreditCents
	// besides the draws Redis counts: CreditCents - BalanceMillicents/1000.
	HeldCents int64
}

// PrepaidOf is a prepaid tenant whose balance is asked for, with the tier
// and the billing calendar its admissions run under.
type PrepaidOf struct {
	TenantID string
	Tier     Tier
	Calendar Calendar
}

// PrepaidStaleError says that an admission was asked with a Prepaid of
// another billing period than the one of the quota store's clock: nothing
// was decided or written. The caller reads the balance of the period
// containing Now and asks again.
type PrepaidStaleError struct{ Now time.Time }

func (e *PrepaidStaleError) Error() string {
	return fmt.Sprintf("the prepaid balance is not of the billing period of %s", e.Now.Format(time.RFC3339))
}
