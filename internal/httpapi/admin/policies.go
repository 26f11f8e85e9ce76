package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// ---- policies (API.md "Policies (v2)"): the body is quota.Policy's JSON;
// the store fills its defaults and validates it.

// ListPolicies answers GET /admin/v1/policies: one page of the policies.
func (s *API) ListPolicies(c *fiber.Ctx) error {
	return paged(c, func(p quota.Page) ([]quota.Policy, *string, error) { return s.store.ListPolicies(c.UserContext(), p) })
}

// CreatePolicy answers POST /admin/v1/policies: it creates the policy
// (audited) and answers 201 with it, defaults filled, and its Location; an
// invalid policy is a 400, a taken name a 409.
func (s *API) CreatePolicy(c *fiber.Ctx) error {
	p, err := decodePolicy(c)
	if err != nil {
		return err
	}
	if p, err = s.admin.CreatePolicy(c.UserContext(), adminActor, p); err != nil {
		return err
	}
	return created(c, "/admin/v1/policies/"+url.PathEscape(p.Name), p)
}

// GetPolicy answers GET /admin/v1/policies/:name with the policy, or a 404.
func (s *API) GetPolicy(c *fiber.Ctx) error { return one(c, "name", s.store.Policy) }

// PatchPolicy answers PATCH /admin/v1/policies/:name: it applies the fields
// given and answers with the policy; an invalid result is a 400, an unknown
// policy a 404.
func (s *API) PatchPolicy(c *fiber.Ctx) error {
	patch, err := decodePolicyPatch(c)
	if err != nil {
		return err
	}
	p, err := s.admin.UpdatePolicy(c.UserContext(), adminActor, c.Params("name"), patch.apply)
	if err != nil {
		return err
	}
	return c.JSON(p)
}

// DeletePolicy answers DELETE /admin/v1/policies/:name with a 204 once the
// policy is deleted (audited), or a 404.
func (s *API) DeletePolicy(c *fiber.Ctx) error { return gone(c, "name", s.admin.DeletePolicy) }

// decodePolicy reads the body of POST /admin/v1/policies.
func decodePolicy(c *fiber.Ctx) (quota.Policy, error) {
	var p quota.Policy
	if err := httpx.DecodeJSON(c, &p); err != nil {
		return p, err
	}
	return p, checkStrings(c.Body())
}

// policyPatch is the body of PATCH /admin/v1/policies/{name}: each member
// given replaces the stored policy's field whole (match, exceptions and
// fallback included); a member set to null removes the field, so that an
// optional one is absent and a defaulted one (scope, cost, on_refuse,
// cold_factor) takes its default again.
type policyPatch map[string]json.RawMessage

// policyFields are the JSON names of quota.Policy's fields: a patch must
// spell them exactly (encoding/json would match any case, and a member
// named twice in two cases would be merged in an order of its own).
var policyFields = func() map[string]bool {
	m := map[string]bool{}
	t := reflect.TypeFor[quota.Policy]()
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			m[name] = true
		}
	}
	return m
}()

func decodePolicyPatch(c *fiber.Ctx) (policyPatch, error) {
	// Decoding into a policy checks what it can of each member given
	// (unknown members, types, NUL in strings) before the store is asked.
	var probe quota.Policy
	if err := httpx.DecodeJSON(c, &probe); err != nil {
		return nil, err
	}
	var patch policyPatch
	if err := json.Unmarshal(c.Body(), &patch); err != nil {
		return nil, fmt.Errorf("admin: policy patch: %w", err)
	}
	if patch == nil { // null: DecodeJSON leaves a struct as it was
		return nil, quota.Errorf(quota.CodeInvalid, "the body must be a JSON object, not null")
	}
	for k := range patch {
		if !policyFields[k] {
			return nil, quota.FieldError(k, "unknown field")
		}
	}
	return patch, checkStrings(c.Body())
}

// apply merges the patch into p.
func (m policyPatch) apply(p *quota.Policy) error {
	cur, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("admin: policy patch: %w", err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(cur, &doc); err != nil {
		return fmt.Errorf("admin: policy patch: %w", err)
	}
	for k, v := range m {
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			delete(doc, k)
		} else {
			doc[k] = v
		}
	}
	merged, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("admin: policy patch: %w", err)
	}
	var out quota.Policy
	if err := json.Unmarshal(merged, &out); err != nil {
		return fmt.Errorf("admin: policy patch: %w", err)
	}
	*p = out
	return nil
}

// checkStrings refuses a JSON body (valid JSON, already decoded) with a
// string, or a member name, that is not valid UTF-8 or holds a NUL
// character, naming the member it is in ("match.meters", "exceptions"):
// encoding/json turns invalid UTF-8 into U+FFFD unnoticed, Postgres cannot
// store NUL in jsonb, and httpx.DecodeJSON looks for NUL in the strings of
// structs only, not in those of lists and maps.
func checkStrings(body []byte) error {
	type frame struct {
		object    bool
		key       string // in an object: the member being read
		expectKey bool
	}
	var stack []frame
	path := func(withKey bool) string {
		var names []string
		for i, f := range stack {
			if f.object && (withKey || i < len(stack)-1) {
				names = append(names, f.key)
			}
		}
		if len(names) == 0 {
			return "body"
		}
		return strings.Join(names, ".")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return quota.Errorf(quota.CodeInvalid, "malformed JSON: %v", err)
		}
		var top *frame
		if len(stack) > 0 {
			top = &stack[len(stack)-1]
		}
		isKey := top != nil && top.object && top.expectKey
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				stack = append(stack, frame{object: t == '{', expectKey: t == '{'})
				continue
			default:
				stack = stack[:len(stack)-1]
			}
		case string:
			raw := body[start:dec.InputOffset()]
			switch {
			case !utf8.Valid(raw):
				return quota.FieldError(path(!isKey), "must be valid UTF-8")
			case strings.ContainsRune(t, 0):
				return quota.FieldError(path(!isKey), "must not contain NUL characters")
			}
			if isKey {
				top.key, top.expectKey = t, false
				continue
			}
		}
		// A value ended: the object holding it expects a key next.
		if len(stack) > 0 && stack[len(stack)-1].object {
			stack[len(stack)-1].expectKey = true
		}
	}
}
