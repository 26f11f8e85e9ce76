package httpx

import (
	"errors"
	"strconv"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"github.com/tollgate/tollgate/internal/quota"
)

// patchBody has what the admin patches have: optional values, a struct
// and a map inside them, a list of structs.
type patchBody struct {
	Name      quota.Optional[string]          `json:"name"`
	Overrides quota.Optional[quota.Overrides] `json:"overrides"`
	Limits    map[string]int64                `json:"limits"`
	Quotas    []quota.MeterQuota              `json:"quotas"`
}

func decodeBody(tb testing.TB, body string, v any) error {
	tb.Helper()
	app := fiber.New()
	var fc fasthttp.RequestCtx
	fc.Request.Header.SetContentType("application/json")
	fc.Request.SetBodyString(body)
	c := app.AcquireCtx(&fc)
	defer app.ReleaseCtx(c)
	return DecodeJSON(c, v)
}

func TestDecodeJSONRefusesMembersNamedTwiceOrUnknown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body  string
		field string // "-": accepted
	}{
		{`{"name": "a", "limits": {"x": 1, "X": 2}, "quotas": [{"meter": "m", "daily_quota": 1}]}`, "-"},
		{` {"name": null} `, "-"},
		{`{"name": "a", "name": "a"}`, "name"},
		{`{"name": "a", "NaMe": "b"}`, "NaMe"},
		{`{"n\u0061me": "a", "name": "b"}`, "name"},
		{`{"limits": {"x": 1, "x": 2}}`, "limits.x"},
		{`{"limits": {"x": 1, "\u0078": 2}}`, "limits.x"},
		{`{"overrides": {"burst": 1, "BURST": 2}}`, "overrides.BURST"},
		{`{"overrides": {"brust": 1}}`, "overrides.brust"},
		{`{"quotas": [{"meter": "m"}, {"meter": "m", "Meter": "n"}]}`, "quotas[1].Meter"},
		{`{"quotas": [[]], "name": "a"}`, "quotas"}, // a type error: the list holds objects
		{`null`, ""},
		{`{"name": "a"} {}`, ""},
	} {
		err := decodeBody(t, tc.body, &patchBody{})
		if tc.field == "-" {
			if err != nil {
				t.Errorf("%s: %v, want accepted", tc.body, err)
			}
			continue
		}
		var qe *quota.Error
		if !errors.As(err, &qe) || qe.Code != quota.CodeInvalid || qe.Field != tc.field {
			t.Errorf("%s: %v, want CodeInvalid naming %q", tc.body, err, tc.field)
		}
	}
	// A map of many keys is checked without comparing each with all.
	body := []byte(`{"limits": {`)
	for i := range 5000 {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `"k`...)
		body = strconv.AppendInt(body, int64(i), 10)
		body = append(body, `": 1`...)
	}
	body = append(body, `, "k4999": 2}}`...)
	var qe *quota.Error
	if err := decodeBody(t, string(body), &patchBody{}); !errors.As(err, &qe) || qe.Field != "limits.k4999" {
		t.Errorf("5,000 keys and one twice: %v, want limits.k4999 named", err)
	}
}
