package pages

// Sign-in sessions of the dashboard and the console.
//
// A tenant signs in with an API key, an admin with the admin token. The
// browser gets only a random session id, in an HttpOnly cookie scoped to its
// area's path (Secure when the request came over HTTPS, as a trusted
// TLS-terminating proxy says with X-Forwarded-Proto); the key or token is
// never stored in the browser. The console's cookies are SameSite=Strict: no
// request another site starts carries them, not even a link followed (an
// admin arriving so signs in again). The dashboard's are SameSite=Lax, so
// that a tenant following a link from the product's own site stays signed
// in; its pages change nothing on a GET. The session lives in the session
// store (Redis) under the SHA-256 of the id, so a copy of it holds no
// usable cookie, for TOLLGATE_SESSION_TTL from sign-in; signing out deletes
// it.
//
// A tenant session remembers its key by prefix, never the secret, and every
// page checks that key as an API call would: revoking or expiring it ends the
// session, suspending the tenant refuses its pages. An admin session
// remembers a MAC of the admin token, so changing TOLLGATE_ADMIN_TOKEN ends
// every admin session.
//
// CSRF: every state-changing form carries the session's random token
// (synchronizer token), compared in constant time; the sign-in forms, which
// have no session yet, carry a token that must equal a cookie set with the
// form (double submit). Every POST must also come from this origin when the
// browser says where it came from (Origin, Sec-Fetch-Site). The token is
// never in a cookie script can read: only in the pages' forms. The metered
// routes' answers share this origin but are sandboxed (httpapi's
// confineAnswer): a document of an upstream's runs in an opaque origin, for
// which these pages are another site's, fetched without the session and
// unreadable.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/quota"
)

// area is one signed-in part of the site.
type area struct {
	kind     string // "tenant" or "admin"
	name     string // "dashboard" or "console", for templates
	base     string // the path every page of the area is under
	cookie   string // the session cookie
	sameSite string // of the area's cookies
}

// The pages' cookies are all named tg_*: the proxy keeps upstreams from
// setting any such cookie (httpapi's stripAnswerCookies).
var (
	tenantArea = area{kind: "tenant", name: "dashboard", base: "/dashboard", cookie: "tg_dashboard", sameSite: fiber.CookieSameSiteLaxMode}
	adminArea  = area{kind: "admin", name: "console", base: "/console", cookie: "tg_console", sameSite: fiber.CookieSameSiteStrictMode}
)

// loginCookie is the double-submit CSRF cookie of a sign-in form.
const loginCookie = "tg_login"

const (
	localSession = "session"
	csrfField    = "_csrf"
)

// session is what Redis keeps of a sign-in.
type session struct {
	Kind      string    `json:"kind"`
	TenantID  string    `json:"tenant_id,omitempty"`
	KeyPrefix string    `json:"key_prefix,omitempty"`
	AdminMAC  string    `json:"admin_mac,omitempty"`
	CSRF      string    `json:"csrf"`
	CreatedAt time.Time `json:"created_at"`

	id string // the cookie value; never stored
}

// randomToken returns 32 random bytes, base64url: 43 characters.
func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("httpapi: random token: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// validToken reports whether s looks like a randomToken, before it is used
// as part of a Redis key or compared.
func validToken(s string) bool {
	if len(s) != 43 {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(s)
	return err == nil
}

// sessionKey is the name the session store keeps the session id under: its
// SHA-256, so that a copy of the store holds no usable cookie.
func sessionKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// adminMAC binds an admin session to the admin token it was opened with.
func adminMAC(token string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("tollgate console session"))
	return hex.EncodeToString(m.Sum(nil))
}

// startSession stores a new session and sets its cookie.
func (s *Pages) startSession(c *fiber.Ctx, a area, sess session) error {
	id, err := randomToken()
	if err != nil {
		return err
	}
	if sess.CSRF, err = randomToken(); err != nil {
		return err
	}
	sess.Kind, sess.CreatedAt = a.kind, s.now().UTC()
	b, err := json.Marshal(sess)
	if err != nil {
		return fmt.Errorf("httpapi: session: %w", err)
	}
	owner := "admin"
	if a.kind == tenantArea.kind {
		owner = "t:" + sess.TenantID
	}
	if err := s.sessions.Put(c.UserContext(), owner, sessionKey(id), b, s.opts.SessionTTL); err != nil {
		return s.unavailable(fmt.Errorf("httpapi: store session: %w", err))
	}
	s.setCookie(c, a, a.cookie, id, a.base, s.opts.SessionTTL)
	return nil
}

// setCookie sets (ttl 0: deletes) one of area a's cookies.
func (s *Pages) setCookie(c *fiber.Ctx, a area, name, value, path string, ttl time.Duration) {
	ck := &fiber.Cookie{Name: name, Value: value, Path: path, HTTPOnly: true,
		SameSite: a.sameSite, Secure: s.guard.Scheme(c) == "https"}
	if ttl > 0 {
		ck.MaxAge = int(ttl / time.Second)
	} else {
		ck.MaxAge, ck.Expires = -1, time.Unix(0, 0)
	}
	c.Cookie(ck)
}

// loadSession returns the area's session of the request, if it has a live one.
func (s *Pages) loadSession(c *fiber.Ctx, a area) (session, bool, error) {
	id := c.Cookies(a.cookie)
	if !validToken(id) {
		return session{}, false, nil
	}
	id = strings.Clone(id)
	raw, found, err := s.sessions.Get(c.UserContext(), sessionKey(id))
	if err == nil && !found {
		return session{}, false, nil
	}
	if err != nil {
		return session{}, false, s.unavailable(fmt.Errorf("httpapi: load session: %w", err))
	}
	var sess session
	if err := json.Unmarshal(raw, &sess); err != nil || sess.Kind != a.kind {
		return session{}, false, nil
	}
	sess.id = id
	return sess, true, nil
}

// endSession deletes the session and its cookie.
func (s *Pages) endSession(c *fiber.Ctx, a area, sess session) error {
	s.setCookie(c, a, a.cookie, "", a.base, 0)
	if sess.id == "" {
		return nil
	}
	if err := s.sessions.Delete(c.UserContext(), sessionKey(sess.id)); err != nil {
		return s.unavailable(fmt.Errorf("httpapi: end session: %w", err))
	}
	return nil
}

func sessionOf(c *fiber.Ctx) session {
	sess, _ := c.Locals(localSession).(session)
	return sess
}

// toLogin sends a request without a live session to the area's sign-in page,
// which brings it back to the page it asked for (GET only) afterwards.
func toLogin(c *fiber.Ctx, a area, reason string) error {
	q := url.Values{}
	if c.Method() == fiber.MethodGet && c.Path() != a.base+"/login" {
		q.Set("next", strings.Clone(c.OriginalURL()))
	}
	if reason != "" {
		q.Set("m", reason)
	}
	loc := a.base + "/login"
	if len(q) > 0 {
		loc += "?" + q.Encode()
	}
	return c.Redirect(loc, fiber.StatusSeeOther)
}

// safeNext returns next when it is a page of the area, else the area's home:
// a sign-in never redirects elsewhere.
func safeNext(a area, next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || u.User != nil || strings.HasPrefix(next, "//") ||
		strings.Contains(next, `\`) || path.Clean(u.Path) != u.Path || u.RawPath != "" ||
		u.Path != a.base && !strings.HasPrefix(u.Path, a.base+"/") || u.Path == a.base+"/login" {
		return a.base
	}
	return next
}

// sameOrigin refuses a state-changing request that the browser says came
// from another site. Browsers send Origin with every form POST; a request
// without Origin (not a browser, or a very old one) is left to the token.
// The origin's host must be the one the request was sent to: its Host, or
// the X-Forwarded-Host of a trusted proxy (httpx.Guard.Host).
func (s *Pages) sameOrigin(c *fiber.Ctx) error {
	if site := c.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return quota.Errorf(quota.CodeForbidden, "cross-site form submission refused")
	}
	if o := c.Get(fiber.HeaderOrigin); o != "" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, s.guard.Host(c)) {
			return quota.Errorf(quota.CodeForbidden, "cross-origin form submission refused")
		}
	}
	return nil
}

// checkCSRF compares the form's token with want in constant time.
func (s *Pages) checkCSRF(c *fiber.Ctx, want string) error {
	if err := s.sameOrigin(c); err != nil {
		return err
	}
	got := string(c.Context().PostArgs().Peek(csrfField))
	if want == "" || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return quota.Errorf(quota.CodeForbidden, "the form has expired or did not come from this site; reload the page and try again")
	}
	return nil
}

// formPost refuses a POST whose body is not a urlencoded form, the only kind
// the pages send.
func formPost(c *fiber.Ctx) error {
	ct := strings.ToLower(strings.TrimSpace(strings.Split(c.Get(fiber.HeaderContentType), ";")[0]))
	if ct != fiber.MIMEApplicationForm {
		return quota.Errorf(quota.CodeUnsupported, "the body must be a form (application/x-www-form-urlencoded)")
	}
	return nil
}

// TenantSession lets through requests of a signed-in tenant whose key is
// still valid, with the principal in the locals; a POST must carry the
// session's CSRF token.
func (s *Pages) TenantSession(c *fiber.Ctx) error {
	sess, ok, err := s.loadSession(c, tenantArea)
	if err != nil {
		return err
	}
	if !ok {
		return toLogin(c, tenantArea, "")
	}
	p, err := s.catalog.KeyPrincipal(c.UserContext(), sess.KeyPrefix)
	switch code := quota.ErrorCode(err); {
	case code == quota.CodeUnauthorized || err == nil && p.Tenant.ID != sess.TenantID:
		return s.expire(c, tenantArea, sess, "key")
	case code == quota.CodeForbidden:
		if err := s.endSession(c, tenantArea, sess); err != nil {
			return err
		}
		return quota.Errorf(quota.CodeForbidden, "this account is suspended; contact support")
	case err != nil:
		return s.unavailable(err)
	}
	httpx.SetPrincipal(c, p)
	return s.enter(c, sess)
}

// expire ends a session that no longer holds and sends to the sign-in page,
// saying why.
func (s *Pages) expire(c *fiber.Ctx, a area, sess session, reason string) error {
	if err := s.endSession(c, a, sess); err != nil {
		return err
	}
	return toLogin(c, a, reason)
}

// enter lets through a request with a live session: a POST must be a form
// carrying the session's CSRF token.
func (s *Pages) enter(c *fiber.Ctx, sess session) error {
	if c.Method() == fiber.MethodPost {
		if err := formPost(c); err != nil {
			return err
		}
		if err := httpx.ReadBody(c, c.App().Config().BodyLimit); err != nil { // the session is known
			return err
		}
		if err := s.checkCSRF(c, sess.CSRF); err != nil {
			return err
		}
	}
	c.Locals(localSession, sess)
	return c.Next()
}

// AdminSession lets through requests of a signed-in admin whose session was
// opened with the current admin token; a POST must carry the CSRF token.
func (s *Pages) AdminSession(c *fiber.Ctx) error {
	sess, ok, err := s.loadSession(c, adminArea)
	if err != nil {
		return err
	}
	if !ok {
		return toLogin(c, adminArea, "")
	}
	if s.opts.AdminToken == "" || !hmac.Equal([]byte(sess.AdminMAC), []byte(adminMAC(s.opts.AdminToken))) {
		return s.expire(c, adminArea, sess, "token")
	}
	return s.enter(c, sess)
}

// loginView is the data of a sign-in page.
type loginView struct {
	Next    string
	Message string // why the user is here (session ended), from an allow-list
	Error   string // why the last attempt failed
}

var loginReasons = map[string]string{
	"key":       "Your sign-in has ended: the API key was revoked or has expired.",
	"token":     "Your sign-in has ended: the admin token has changed.",
	"signedout": "You are signed out.",
}

// loginForm shows the area's sign-in form with a fresh double-submit token.
// The token is kept while its cookie lives, so that sign-in forms open in
// several tabs all stay valid.
func (s *Pages) loginForm(c *fiber.Ctx, a area, status int, lv loginView) error {
	tok := c.Cookies(loginCookie)
	if !validToken(tok) {
		var err error
		if tok, err = randomToken(); err != nil {
			return err
		}
	}
	tok = strings.Clone(tok)
	s.setCookie(c, a, loginCookie, tok, a.base+"/login", time.Hour)
	title := "Sign in"
	if a == adminArea {
		title = "Admin sign-in"
	}
	return s.render(c, status, "login", view{Title: title, Area: a.name, CSRF: tok, Data: lv})
}

func (s *Pages) showLogin(c *fiber.Ctx, a area) error {
	if _, ok, err := s.loadSession(c, a); err != nil {
		return err
	} else if ok {
		return c.Redirect(safeNext(a, c.Query("next")), fiber.StatusSeeOther)
	}
	return s.loginForm(c, a, fiber.StatusOK, loginView{Next: safeNext(a, c.Query("next")), Message: loginReasons[c.Query("m")]})
}

// DashLoginForm shows the dashboard's sign-in form, or redirects (303) a
// signed-in tenant to the page it asked for.
func (s *Pages) DashLoginForm(c *fiber.Ctx) error { return s.showLogin(c, tenantArea) }

// ConsoleLoginForm shows the console's sign-in form, or redirects (303) a
// signed-in admin to the page it asked for.
func (s *Pages) ConsoleLoginForm(c *fiber.Ctx) error { return s.showLogin(c, adminArea) }

// loginFormLimit bounds the body of a sign-in form, read before anything
// is known of its sender: a few hundred bytes in use.
const loginFormLimit = 8 << 10

// checkLogin checks a sign-in POST: its form, origin and double-submit
// token. It returns the form's fields. The secret itself is checked, and
// failures limited, as the API checks it: a key as tenantAuth does, the admin
// token as adminAuth does.
func (s *Pages) checkLogin(c *fiber.Ctx, secretField string) (map[string]string, error) {
	if err := formPost(c); err != nil {
		return nil, err
	}
	if err := s.sameOrigin(c); err != nil {
		return nil, err
	}
	if err := httpx.ReadBody(c, loginFormLimit); err != nil {
		return nil, err
	}
	f, err := readForm(c, csrfField, secretField, "next")
	if err != nil {
		return nil, err
	}
	if err := checkLoginToken(c, f[csrfField]); err != nil {
		return nil, err
	}
	return f, nil
}

func checkLoginToken(c *fiber.Ctx, got string) error {
	want := c.Cookies(loginCookie)
	if !validToken(want) || subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return quota.Errorf(quota.CodeForbidden, "the sign-in form has expired; reload the page and try again")
	}
	return nil
}

// DashLogin exchanges an API key for a tenant session.
func (s *Pages) DashLogin(c *fiber.Ctx) error {
	f, err := s.checkLogin(c, "api_key")
	if err != nil {
		return err
	}
	next := safeNext(tenantArea, f["next"])
	p, err := s.catalog.Resolve(c.UserContext(), strings.TrimSpace(f["api_key"]))
	switch quota.ErrorCode(err) {
	case quota.CodeUnauthorized:
		if err := s.guard.KeyFailed(c, "sign-ins"); err != nil {
			return err
		}
		return s.loginForm(c, tenantArea, fiber.StatusUnauthorized, loginView{Next: next,
			Error: "That API key is not valid: it is unknown, revoked or expired."})
	case quota.CodeForbidden:
		return s.loginForm(c, tenantArea, fiber.StatusForbidden, loginView{Next: next,
			Error: "This account is suspended; contact support."})
	}
	if err != nil {
		return err
	}
	return s.signedIn(c, tenantArea, session{TenantID: p.Tenant.ID, KeyPrefix: p.KeyPrefix}, next)
}

// signedIn starts the session of a successful sign-in and goes on to next.
// The sign-in form's cookie stays: a form open in another tab still works.
func (s *Pages) signedIn(c *fiber.Ctx, a area, sess session, next string) error {
	if err := s.startSession(c, a, sess); err != nil {
		return err
	}
	return c.Redirect(next, fiber.StatusSeeOther)
}

// ConsoleLogin exchanges the admin token for an admin session.
func (s *Pages) ConsoleLogin(c *fiber.Ctx) error {
	f, err := s.checkLogin(c, "token")
	if err != nil {
		return err
	}
	next := safeNext(adminArea, f["next"])
	ok, err := s.guard.TokenIs(c, s.guard.Admin, strings.TrimSpace(f["token"]), s.opts.AdminToken, "sign-ins")
	if err != nil {
		return err
	}
	if !ok {
		msg := "That is not the admin token."
		if s.opts.AdminToken == "" {
			msg = "The console is disabled: the server has no TOLLGATE_ADMIN_TOKEN."
		}
		return s.loginForm(c, adminArea, fiber.StatusUnauthorized, loginView{Next: next, Error: msg})
	}
	return s.signedIn(c, adminArea, session{AdminMAC: adminMAC(s.opts.AdminToken)}, next)
}

func (s *Pages) logout(c *fiber.Ctx, a area) error {
	if _, err := readForm(c, csrfField); err != nil {
		return err
	}
	if err := s.endSession(c, a, sessionOf(c)); err != nil {
		return err
	}
	return c.Redirect(a.base+"/login?m=signedout", fiber.StatusSeeOther)
}

// DashLogout ends the tenant's dashboard session and redirects (303) to the
// sign-in form.
func (s *Pages) DashLogout(c *fiber.Ctx) error { return s.logout(c, tenantArea) }

// ConsoleLogout ends the admin's console session and redirects (303) to the
// sign-in form.
func (s *Pages) ConsoleLogout(c *fiber.Ctx) error { return s.logout(c, adminArea) }
