// Package httpapi is Tollgate's HTTP layer: the Fiber app, its middleware,
// every route (registered in routes) and the one mapping of errors to
// problem+json. Handlers are thin: parse, call the domain, encode.
package httpapi

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
	"github.com/tollgate/tollgate/internal/usage"
)

// Options are the settings the HTTP layer needs.
type Options struct {
	BodyLimit    int
	AdminToken   string
	ServiceToken string
	// RedisPrefix prefixes the dashboard's session keys (default "tg").
	RedisPrefix string
	// SessionTTL is the lifetime of a dashboard or console sign-in (default 8h).
	SessionTTL time.Duration
	// TrustedProxies are the proxies whose X-Forwarded-For names the client
	// (see clientIP); none: the client is the connection's peer.
	TrustedProxies []netip.Prefix
	// WebhookAllowPrivate lets tenants' webhook URLs name loopback,
	// link-local and private addresses.
	WebhookAllowPrivate bool
}

// gate is the door to quota state of the metered requests and /v1/check
// (*admission.Gate): admissions, refunds and idempotent answers.
type gate interface {
	Admit(ctx context.Context, req quota.Request) (quota.Decision, error)
	Refund(ctx context.Context, req quota.Request, d quota.Decision) error
	StoreAnswer(ctx context.Context, req quota.Request, a quota.StoredAnswer) error
	ReleaseKey(ctx context.Context, req quota.Request) error
	Answer(ctx context.Context, req quota.Request) (quota.StoredAnswer, error)
}

// records is what the admin API and the console read of the store of
// tiers, tenants, keys, grants and the audit log (*postgres.Store): listings
// and single records, read through to Postgres, never cached.
type records interface {
	ListTiers(ctx context.Context, p quota.Page) ([]quota.Tier, *string, error)
	Tier(ctx context.Context, slug string) (quota.Tier, error)
	Tiers(ctx context.Context) ([]quota.Tier, error)
	ListTenants(ctx context.Context, f quota.TenantFilter, p quota.Page) ([]quota.Tenant, *string, error)
	Tenant(ctx context.Context, id string) (quota.Tenant, error)
	TenantsByID(ctx context.Context, ids []string) ([]quota.Tenant, error)
	ListKeys(ctx context.Context, tenantID string, p quota.Page) ([]quota.APIKey, *string, error)
	ListGrants(ctx context.Context, tenantID string, p quota.Page) ([]quota.Grant, *string, error)
	ListAudit(ctx context.Context, entity, entityID string, p quota.Page) ([]quota.AuditEntry, *string, error)
}

// ReadyCheck is one dependency /readyz checks: Check returns nil when the
// dependency is ready.
type ReadyCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// Deps are the parts the handlers use; cmd/api builds them.
type Deps struct {
	Log     *slog.Logger
	Store   records
	Redis   redis.UniversalClient // the dashboard's sessions
	Catalog *catalog.Catalog
	Grants  *catalog.Grants
	Gate    gate
	Ledger  *billing.Ledger
	Usage   *usage.Reader
	Alerts  *billing.Deliverer // for listing alerts
	Ready   []ReadyCheck       // what /readyz checks
	Routes  *routes.Table
	Metrics *Metrics
	Now     func() time.Time
}

// Server holds the Fiber app and what its handlers use.
type Server struct {
	app      *fiber.App
	log      *slog.Logger
	store    records
	rdb      redis.UniversalClient
	catalog  *catalog.Catalog
	grants   *catalog.Grants
	gate     gate
	ready    []ReadyCheck
	ledger   *billing.Ledger
	reports  *usage.Reader
	alerts   *billing.Deliverer
	routes   *routes.Table
	metrics  *Metrics
	authFail *authFailures
	now      func() time.Time
	opts     Options
	views    *views
	assets   map[string]asset

	// authFail counts failed API keys and dashboard sign-ins; adminFail
	// failed admin tokens (admin API and console sign-in); serviceFail failed
	// service tokens. Realms apart: failing in one locks nothing in another.
	adminFail, serviceFail *authFailures
}

// The dashboard's templates and files are embedded: failing to parse them is
// a bug of the build, caught by any test, not a condition to handle.
var pageViews, pageAssets = func() (*views, map[string]asset) {
	v, err := loadViews()
	if err != nil {
		panic(err)
	}
	a, err := loadAssets()
	if err != nil {
		panic(err)
	}
	return v, a
}()

// New builds the Fiber app with every route registered.
func New(d Deps, opts Options) *Server {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.Routes == nil {
		d.Routes = routes.Default()
	}
	if opts.RedisPrefix == "" {
		opts.RedisPrefix = "tg"
	}
	if opts.SessionTTL <= 0 {
		opts.SessionTTL = 8 * time.Hour
	}
	s := &Server{log: d.Log, store: d.Store, now: d.Now, rdb: d.Redis, catalog: d.Catalog, grants: d.Grants, gate: d.Gate, ready: d.Ready,
		ledger: d.Ledger, reports: d.Usage, alerts: d.Alerts, routes: d.Routes, metrics: d.Metrics, authFail: newAuthFailures(d.Now),
		adminFail: newAuthFailures(d.Now), serviceFail: newAuthFailures(d.Now), opts: opts,
		views: pageViews, assets: pageAssets}
	s.app = fiber.New(fiber.Config{
		AppName:               "tollgate",
		BodyLimit:             opts.BodyLimit,
		DisableStartupMessage: true,
		ErrorHandler:          errorHandler(d.Log, s.errorPage),
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          60 * time.Second,
		IdleTimeout:           120 * time.Second,
	})
	// Answers sent while shutting down say Connection: close.
	s.app.Server().CloseOnShutdown = true
	s.routesSetup()
	return s
}

// App returns the Fiber app, for Listener and for tests' app.Test.
func (s *Server) App() *fiber.App { return s.app }

// routesSetup registers every route of the service, in one place.
func (s *Server) routesSetup() {
	s.app.Use(requestIDs)
	s.app.Use(accessLog(s.log, s.clientIP))
	s.app.Use(recover.New())

	s.app.Get("/healthz", s.healthz)
	s.app.Get("/readyz", s.readyz)
	s.app.Get("/openapi.json", s.openapi)
	s.app.Get("/metrics", adaptor.HTTPHandler(promhttp.HandlerFor(s.metrics.Registry, promhttp.HandlerOpts{})))

	s.app.All("/api/*", s.metered) // authenticates as tenantAuth does
	v1 := s.app.Group("/v1", checkQuery)
	v1.Get("/usage", s.tenantAuth, s.usage)
	v1.Get("/invoices", s.tenantAuth, s.invoices)
	v1.Post("/check", s.check)

	admin := s.app.Group("/admin/v1", s.adminAuth, checkQuery)
	admin.Get("/tiers", s.listTiers)
	admin.Post("/tiers", s.createTier)
	admin.Get("/tiers/:slug", s.getTier)
	admin.Patch("/tiers/:slug", s.patchTier)
	admin.Delete("/tiers/:slug", s.deleteTier)
	admin.Get("/tenants", s.listTenants)
	admin.Post("/tenants", s.createTenant)
	admin.Get("/tenants/:id", s.getTenant)
	admin.Patch("/tenants/:id", s.patchTenant)
	admin.Delete("/tenants/:id", s.deleteTenant)
	admin.Get("/tenants/:id/keys", s.listKeys)
	admin.Post("/tenants/:id/keys", s.issueKey)
	admin.Delete("/keys/:id", s.revokeKey)
	admin.Post("/keys/:id/rotate", s.rotateKey)
	admin.Get("/tenants/:id/grants", s.listGrants)
	admin.Post("/tenants/:id/grants", s.createGrant)
	admin.Get("/tenants/:id/usage", s.tenantUsage)
	admin.Get("/tenants/:id/summary", s.tenantSummary)
	admin.Get("/invoices", s.listInvoices)
	admin.Get("/audit", s.listAudit)
	admin.Get("/alerts", s.listAlerts)

	// The web pages: the tenants' dashboard and the admins' console. Every
	// POST of a signed-in area is checked for its CSRF token by the session
	// middleware; the sign-in forms check theirs themselves.
	s.app.Get("/", func(c *fiber.Ctx) error { return c.Redirect("/dashboard", fiber.StatusFound) })
	s.app.Get("/robots.txt", s.robots)
	s.app.Get("/assets/:file", s.serveAsset)
	dash := s.app.Group("/dashboard", checkQuery)
	dash.Get("/login", s.dashLoginForm)
	dash.Post("/login", s.dashLogin)
	dash.Post("/logout", s.tenantSession, s.dashLogout)
	dash.Get("", s.tenantSession, s.dashHome)
	dash.Get("/invoices/:id", s.tenantSession, s.dashInvoice)
	con := s.app.Group("/console", checkQuery)
	con.Get("/login", s.consoleLoginForm)
	con.Post("/login", s.consoleLogin)
	con.Post("/logout", s.adminSession, s.consoleLogout)
	con.Get("", s.adminSession, s.consoleHome)
	con.Get("/tiers", s.adminSession, s.consoleTiers)
	con.Post("/tiers", s.adminSession, s.consoleCreateTier)
	con.Get("/new-tier", s.adminSession, s.consoleNewTier) // not under /tiers/: any name there may be a slug
	con.Get("/tiers/:slug", s.adminSession, s.consoleTierForm)
	con.Post("/tiers/:slug", s.adminSession, s.consoleSaveTier)
	con.Get("/tenants", s.adminSession, s.consoleTenants)
	con.Post("/tenants", s.adminSession, s.consoleCreateTenant)
	con.Get("/tenants/:id", s.adminSession, s.consoleTenant)
	con.Post("/tenants/:id/keys", s.adminSession, s.consoleIssueKey)
	con.Post("/tenants/:id/grants", s.adminSession, s.consoleGrant)
	con.Post("/tenants/:id/tier", s.adminSession, s.consoleSetTier)
	con.Post("/tenants/:id/status", s.adminSession, s.consoleSetStatus)
	con.Post("/keys/:id/revoke", s.adminSession, s.consoleRevokeKey)
	con.Get("/invoices", s.adminSession, s.consoleInvoices)
	con.Get("/invoices.csv", s.adminSession, s.consoleInvoicesCSV)
	con.Get("/alerts", s.adminSession, s.consoleAlerts)
}

func (s *Server) healthz(c *fiber.Ctx) error {
	return c.JSON(fiber.Map{"status": "ok"})
}

// readyz answers 200 only when every dependency is ready (for the api:
// Redis and Postgres answer and the schema is the one this binary expects).
func (s *Server) readyz(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), 2*time.Second)
	defer cancel()
	checks := fiber.Map{}
	ready := true
	for _, r := range s.ready {
		checks[r.Name] = "ok"
		if err := r.Check(ctx); err != nil {
			checks[r.Name], ready = err.Error(), false
		}
	}
	if !ready {
		return writeProblem(c, Problem{Status: fiber.StatusServiceUnavailable, Title: "Not Ready",
			Detail: "a dependency is not ready", Extra: map[string]any{"checks": checks}})
	}
	return c.JSON(fiber.Map{"status": "ready", "checks": checks})
}
