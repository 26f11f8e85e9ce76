package httpx

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/quota"
)

// ParsePeriod reads a month such as 2026-11.
func ParsePeriod(raw string) (time.Time, error) {
	period, err := time.Parse("2006-01", raw)
	if err != nil {
		return period, quota.FieldError("period", "must be a month such as 2026-11")
	}
	return period, nil
}

// InvoiceSource lists the invoices of a month (*billing.Ledger).
type InvoiceSource interface {
	EachInvoice(ctx context.Context, period time.Time, fn func(billing.Invoice) error) error
}

// InvoicesCSV streams the invoices of a month (their label: see
// billing.Invoice) as CSV, one row per line, for the admin API and the
// console's download. New columns go at the end (period_start and
// period_end came last): readers go by position.
func InvoicesCSV(c *fiber.Ctx, log *slog.Logger, invoices InvoiceSource, raw string, period time.Time) error {
	c.Attachment("invoices-" + raw + ".csv")
	return Stream(c, log, "text/csv; charset=utf-8", func(ctx context.Context, w *bufio.Writer) error {
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"invoice_id", "tenant_id", "period", "status", "currency", "total_cents", "line", "kind", "description", "quantity", "amount_cents",
			"period_start", "period_end"})
		err := invoices.EachInvoice(ctx, period, func(inv billing.Invoice) error {
			for i, l := range inv.Lines {
				if err := cw.Write([]string{inv.ID, inv.TenantID, inv.Period, inv.Status, inv.Currency, Itoa(inv.TotalCents),
					strconv.Itoa(i + 1), l.Kind, l.Description, Itoa(l.Quantity), Itoa(l.AmountCents),
					inv.PeriodStart.UTC().Format(time.RFC3339), inv.PeriodEnd.UTC().Format(time.RFC3339)}); err != nil {
					return err
				}
			}
			return nil
		})
		cw.Flush()
		return err
	})
}

// Stream answers 200 with a body written by write after the handler
// returns, straight from the database cursor to the socket. An error after
// the first byte can no longer change the status: it is logged and the body
// is cut short, which the client sees as a truncated document.
func Stream(c *fiber.Ctx, log *slog.Logger, contentType string, write func(context.Context, *bufio.Writer) error) error {
	c.Set(fiber.HeaderContentType, contentType)
	c.Set(fiber.HeaderCacheControl, "no-store")
	path := strings.Clone(c.Path()) // used after the handler returns
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := write(ctx, w); err != nil {
			log.Error("export failed mid-stream", "path", path, "err", err)
		}
		_ = w.Flush()
	})
	return nil
}

// JSONItems writes {"items": [...], "next_cursor": null}, one item at a time.
func JSONItems(w *bufio.Writer, each func(item func(any) error) error) error {
	_, _ = w.WriteString(`{"items":[`)
	n := 0
	err := each(func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if n > 0 {
			_ = w.WriteByte(',')
		}
		n++
		_, err = w.Write(b)
		if n%256 == 0 {
			_ = w.Flush()
		}
		return err
	})
	_, _ = w.WriteString(`],"next_cursor":null}`)
	return err
}

// ValidURL accepts "" or an absolute http(s) URL.
func ValidURL(field, v string) error {
	if v == "" {
		return nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(v) > quota.MaxURLLength ||
		strings.ContainsAny(v, " \t\r\n") {
		return quota.FieldError(field, "must be an http or https URL of at most %d characters", quota.MaxURLLength)
	}
	return nil
}

// WantsCSV reports whether the client asked for text/csv.
func WantsCSV(c *fiber.Ctx) bool {
	return c.Accepts(fiber.MIMEApplicationJSON, "text/csv") == "text/csv"
}

// MaxIdempotencyKey bounds the Idempotency-Key header.
const MaxIdempotencyKey = 255

// Itoa formats n in base 10.
func Itoa(n int64) string { return strconv.FormatInt(n, 10) }

// IdempotencyKey returns the request's Idempotency-Key, validated.
func IdempotencyKey(c *fiber.Ctx) (string, error) {
	k := c.Get("Idempotency-Key")
	if k == "" {
		return "", nil
	}
	if len(k) > MaxIdempotencyKey {
		return "", quota.FieldError("Idempotency-Key", "must be at most %d characters", MaxIdempotencyKey)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return "", quota.FieldError("Idempotency-Key", "must be visible ASCII characters")
		}
	}
	return k, nil
}
