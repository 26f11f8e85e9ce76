// Package httpapi is Tollgate's HTTP layer: the Fiber app, its middleware,
// every route (registered in routes) and the one mapping of errors to
// problem+json. Handlers are thin: parse, call the domain, encode.
//
// It parses and encodes: the rules of admission, settlement and billing are
// internal/admission's and the services' (it imports no Redis, limit or
// policy package: the architecture test holds it).
package httpapi

import (
	"cmp"
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate/tollgate/internal/admission"
	"github.com/tollgate/tollgate/internal/billing"
	"github.com/tollgate/tollgate/internal/catalog"
	"github.com/tollgate/tollgate/internal/httpapi/admin"
	"github.com/tollgate/tollgate/internal/httpapi/httpx"
	"github.com/tollgate/tollgate/internal/httpapi/pages"
	"github.com/tollgate/tollgate/internal/quota"
	"github.com/tollgate/tollgate/internal/routes"
	"github.com/tollgate/tollgate/internal/usage"
)

// Options are the settings the HTTP layer needs.
type Options struct {
	BodyLimit    int
	AdminToken   string
	ServiceToken string
	// SessionTTL is the lifetime of a dashboard or console sign-in (default 8h).
	SessionTTL time.Duration
	// TrustedProxies are the proxies whose X-Forwarded-For names the client
	// (see httpx.Guard.ClientIP); none: the client is the connection's peer.
	TrustedProxies []netip.Prefix
	// WebhookAllowPrivate lets tenants' webhook URLs name loopback,
	// link-local and private addresses.
	WebhookAllowPrivate bool
	// MaxResponseBytes is the largest upstream answer body the proxy passes
	// on (proxybody.go); 0: no maximum.
	MaxResponseBytes int64
	// Ops serves /metrics and /readyz with its checks on an app of their own
	// (OpsApp, for TOLLGATE_OPS_ADDR); the public app then has no /metrics
	// and a /readyz without checks (ops.go).
	Ops bool
	// MaxConns is the listener's cap on connections (connlimit), which
	// sizes the server's pool of connection workers; 0: fasthttp's default.
	MaxConns int
	// ReadTimeout bounds the reading of a request from its first byte (of
	// a new connection, its first request); IdleTimeout the wait of a
	// kept-alive connection for its next one. 0: 30 s and 120 s.
	ReadTimeout, IdleTimeout time.Duration
	// MaxResponseHeaderBytes is the largest header block of an upstream's
	// answer the proxy reads (proxybody.go); 0: defaultAnswerHeader.
	MaxResponseHeaderBytes int
}

// records is the store of tiers, tenants, keys, grants and the audit log
// (*catalogdb.Store) as the admin API and the pages read it.
type records interface {
	admin.Records
	pages.Records
	// AuditSettlement records a settlement in the audit log (settle.go).
	AuditSettlement(ctx context.Context, actor string, r quota.SettlementRecord) error
}

// ReadyCheck is one dependency /readyz checks: Check returns nil when the
// dependency is ready.
type ReadyCheck struct {
	Name  string
	Check func(ctx context.Context) error
}

// Deps are the parts the handlers use; internal/app (RunAPI) builds them.
type Deps struct {
	Log   *slog.Logger
	Store records
	// Sessions keeps the dashboard's and the console's sign-ins
	// (*redisdb.Sessions).
	Sessions pages.SessionStore
	Catalog  *catalog.Catalog
	// Admin is the catalog's admin writes (tiers, tenants, keys,
	// policies), for the admin API and the console.
	Admin  *catalog.Admin
	Grants *catalog.Grants
	Plans  *catalog.Plans
	// Gate is the door to quota state, behind the admission use case
	// (admission.Service) of the metered requests and the decision API.
	Gate    *admission.Gate
	Ledger  *billing.Ledger
	Usage   *usage.Reader
	Alerts  *billing.Deliverer // for listing alerts
	Ready   []ReadyCheck       // what /readyz checks
	Routes  *routes.Table
	Metrics *Metrics
	Now     func() time.Time
	// Policies lists the policies (*catalog.Catalog); nil: none apply.
	Policies policyList
	// Tracer makes the spans of the metered requests and the decision API
	// (telemetry.Traces.Tracer); nil: no traces, at no cost.
	Tracer trace.Tracer
}

// Server holds the Fiber app and what the metered path, /v1 and the probes
// use; the admin API and the pages hold their own.
type Server struct {
	app     *fiber.App
	log     *slog.Logger
	catalog *catalog.Catalog
	// adm is the admission use case: admissions, reservations,
	// idempotent answers, refunds, settlements.
	adm     *admission.Service
	ready   []ReadyCheck
	ledger  *billing.Ledger
	reports *usage.Reader
	routes  *routes.Table
	metrics *Metrics
	now     func() time.Time
	// policies lists the policies the metered path matches requests to.
	policies policyList
	opts     Options
	// upstream is the client of the proxied routes (newUpstreamClient).
	upstream *fasthttp.Client
	// bodyLimit is the largest request body read (Fiber's BodyLimit:
	// Options.BodyLimit, or Fiber's default); see httpx.ReadBody.
	bodyLimit int
	guard     *httpx.Guard
	admin     *admin.API
	pages     *pages.Pages
	// ops is the operations listener's app (Options.Ops); nil: none.
	ops *fiber.App
	// tracer makes the spans (tracing.go); nil: none.
	tracer trace.Tracer
}

// New builds the Fiber app with every route registered. It fails only when
// the pages' embedded templates do not load (a bug of the build).
func New(d Deps, opts Options) (*Server, error) {
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Metrics == nil {
		d.Metrics = NewMetrics()
	}
	if d.Routes == nil {
		d.Routes = routes.Default()
	}
	if d.Gate != nil {
		d.Metrics.watchWaiters(d.Gate.Waiters)
		d.Metrics.watchOutage(d.Gate)
	}
	guard := httpx.NewGuard(opts.TrustedProxies, d.Now, d.Metrics.AuthFailures.Inc)
	pg, err := pages.New(pages.Deps{Store: d.Store, Catalog: d.Catalog, Admin: d.Admin, Grants: d.Grants, Plans: d.Plans, Ledger: d.Ledger,
		Alerts: d.Alerts, Usage: d.Usage, Sessions: d.Sessions, Guard: guard, Log: d.Log, Now: d.Now,
		AdminToken: opts.AdminToken, SessionTTL: opts.SessionTTL})
	if err != nil {
		return nil, err
	}
	adm := admission.NewService(admission.ServiceDeps{Gate: d.Gate, Balances: d.Catalog, Policies: d.Policies,
		Audit: d.Store, Log: d.Log, Now: d.Now, Tracer: d.Tracer})
	s := &Server{log: d.Log, now: d.Now, catalog: d.Catalog, adm: adm, ready: d.Ready,
		ledger: d.Ledger, reports: d.Usage, routes: d.Routes, metrics: d.Metrics, policies: d.Policies, opts: opts, guard: guard,
		upstream: newUpstreamClient(opts.MaxResponseBytes, opts.MaxResponseHeaderBytes),
		admin: admin.New(admin.Deps{Store: d.Store, Catalog: d.Catalog, Admin: d.Admin, Grants: d.Grants, Plans: d.Plans, Ledger: d.Ledger,
			Alerts: d.Alerts, Usage: d.Usage, Guard: guard, Log: d.Log, Now: d.Now,
			AdminToken: opts.AdminToken, WebhookAllowPrivate: opts.WebhookAllowPrivate}),
		pages: pg, tracer: d.Tracer}
	s.app = fiber.New(fiber.Config{
		AppName:               "tollgate",
		BodyLimit:             opts.BodyLimit,
		DisableStartupMessage: true,
		ErrorHandler:          httpx.ErrorHandler(d.Log, pages.IsPage, s.pages.ErrorPage),
		ReadTimeout:           cmp.Or(opts.ReadTimeout, 30*time.Second),
		WriteTimeout:          60 * time.Second,
		IdleTimeout:           cmp.Or(opts.IdleTimeout, 120*time.Second),
		Concurrency:           workers(opts.MaxConns),
		// Bodies are read by the handlers once they know the sender
		// (httpx.ReadBody, within BodyLimit); fasthttp reads readAhead
		// bytes of one at most, whatever length it announces, and
		// preparses no form.
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		// No proxy is trusted by Fiber itself: c.Hostname(), c.Protocol()
		// and c.IP() then never read X-Forwarded-* headers, which any
		// client can send. The guard alone decides which peers are
		// trusted proxies (TOLLGATE_TRUSTED_PROXIES) and reads them.
		EnableTrustedProxyCheck: true,
	})
	s.bodyLimit = s.app.Config().BodyLimit
	// With StreamRequestBody, fasthttp's MaxRequestBodySize (Fiber sets it
	// to BodyLimit) refuses nothing: it is how much of a body fasthttp
	// reads before the handler runs.
	s.app.Server().MaxRequestBodySize = readAhead
	// Answers sent while shutting down say Connection: close.
	s.app.Server().CloseOnShutdown = true
	if opts.Ops {
		s.ops = newOpsApp(d.Log)
	}
	s.routesSetup()
	return s, nil
}

// readAhead is the most of a request's body read before its handler runs,
// that is, before anything is known of its sender: a body up to it is read
// whole at once, a longer one by httpx.ReadBody.
const readAhead = 4 << 10

// workers sizes fasthttp's pool of connection workers for a listener that
// holds maxConns connections: a little above it, since the listener counts a
// connection out as soon as it is closed, a moment before its worker is
// free for the next one (fasthttp answers a connection past its pool with
// a plain 503 of its own). 0: fasthttp's default.
func workers(maxConns int) int {
	if maxConns <= 0 {
		return 0
	}
	return maxConns + maxConns/16 + 16
}

// App returns the Fiber app, for Listener and for tests' app.Test.
func (s *Server) App() *fiber.App { return s.app }

// routesSetup registers every route of the service, in one place.
func (s *Server) routesSetup() {
	s.app.Use(httpx.RequestIDs)
	s.app.Use(httpx.AccessLog(s.log, s.guard.ClientIP))
	s.app.Use(recover.New())
	s.app.Use(httpx.BodyGuard(s.bodyLimit))

	s.opsRoutes() // /healthz, /readyz, /metrics: here, or some on the ops app
	s.app.Get("/openapi.json", s.openapi)

	// (traced: in a span when tracing is on; the handler itself otherwise)
	s.app.All("/api/*", s.traced(s.metered)) // authenticates as tenantAuth does
	v1 := s.app.Group("/v1", httpx.CheckQuery)
	v1.Get("/usage", s.tenantAuth, s.usage)
	v1.Get("/invoices", s.tenantAuth, s.invoices)
	v1.Post("/check", s.traced(s.check))
	v1.Post("/settle", s.traced(s.settle))
	v1.Post("/refund", s.traced(s.refund))
	v1.Post("/release", s.traced(s.releaseCheck))

	admin := s.app.Group("/admin/v1", s.admin.Auth, httpx.CheckQuery, httpx.PlainBody(s.bodyLimit))
	admin.Get("/tiers", s.admin.ListTiers)
	admin.Post("/tiers", s.admin.CreateTier)
	admin.Get("/tiers/:slug", s.admin.GetTier)
	admin.Patch("/tiers/:slug", s.admin.PatchTier)
	admin.Delete("/tiers/:slug", s.admin.DeleteTier)
	admin.Get("/policies", s.admin.ListPolicies)
	admin.Post("/policies", s.admin.CreatePolicy)
	admin.Get("/policies/:name", s.admin.GetPolicy)
	admin.Patch("/policies/:name", s.admin.PatchPolicy)
	admin.Delete("/policies/:name", s.admin.DeletePolicy)
	admin.Get("/tenants", s.admin.ListTenants)
	admin.Post("/tenants", s.admin.CreateTenant)
	admin.Get("/tenants/:id", s.admin.GetTenant)
	admin.Patch("/tenants/:id", s.admin.PatchTenant)
	admin.Delete("/tenants/:id", s.admin.DeleteTenant)
	admin.Get("/tenants/:id/keys", s.admin.ListKeys)
	admin.Post("/tenants/:id/keys", s.admin.IssueKey)
	admin.Get("/keys/:id", s.admin.GetKey)
	admin.Delete("/keys/:id", s.admin.RevokeKey)
	admin.Post("/keys/:id/rotate", s.admin.RotateKey)
	admin.Get("/tenants/:id/grants", s.admin.ListGrants)
	admin.Post("/tenants/:id/grants", s.admin.CreateGrant)
	admin.Get("/tenants/:id/grants/:grant", s.admin.GetGrant)
	admin.Get("/tenants/:id/credits", s.admin.ListCredits)
	admin.Post("/tenants/:id/credits", s.admin.CreateCredit)
	admin.Get("/tenants/:id/credits/:credit", s.admin.GetCredit)
	admin.Get("/tenants/:id/usage", s.admin.TenantUsage)
	admin.Get("/tenants/:id/summary", s.admin.TenantSummary)
	admin.Get("/invoices", s.admin.ListInvoices)
	admin.Get("/audit", s.admin.ListAudit)
	admin.Get("/alerts", s.admin.ListAlerts)

	// The web pages: the tenants' dashboard and the admins' console. Every
	// POST of a signed-in area is checked for its CSRF token by the session
	// middleware; the sign-in forms check theirs themselves.
	s.app.Get("/", func(c *fiber.Ctx) error { return c.Redirect("/dashboard", fiber.StatusFound) })
	s.app.Get("/robots.txt", s.pages.Robots)
	s.app.Get("/assets/:file", s.pages.ServeAsset)
	dash := s.app.Group("/dashboard", httpx.CheckQuery)
	dash.Get("/login", s.pages.DashLoginForm)
	dash.Post("/login", s.pages.DashLogin)
	dash.Post("/logout", s.pages.TenantSession, s.pages.DashLogout)
	dash.Get("", s.pages.TenantSession, s.pages.DashHome)
	dash.Get("/invoices/:id", s.pages.TenantSession, s.pages.DashInvoice)
	con := s.app.Group("/console", httpx.CheckQuery)
	con.Get("/login", s.pages.ConsoleLoginForm)
	con.Post("/login", s.pages.ConsoleLogin)
	con.Post("/logout", s.pages.AdminSession, s.pages.ConsoleLogout)
	con.Get("", s.pages.AdminSession, s.pages.ConsoleHome)
	con.Get("/tiers", s.pages.AdminSession, s.pages.ConsoleTiers)
	con.Post("/tiers", s.pages.AdminSession, s.pages.ConsoleCreateTier)
	con.Get("/new-tier", s.pages.AdminSession, s.pages.ConsoleNewTier) // not under /tiers/: any name there may be a slug
	con.Get("/tiers/:slug", s.pages.AdminSession, s.pages.ConsoleTierForm)
	con.Post("/tiers/:slug", s.pages.AdminSession, s.pages.ConsoleSaveTier)
	con.Get("/policies", s.pages.AdminSession, s.pages.ConsolePolicies)
	con.Post("/policies", s.pages.AdminSession, s.pages.ConsoleCreatePolicy)
	con.Get("/new-policy", s.pages.AdminSession, s.pages.ConsoleNewPolicy) // not under /policies/: any name there may be a policy's
	con.Get("/policies/:name", s.pages.AdminSession, s.pages.ConsolePolicyForm)
	con.Post("/policies/:name", s.pages.AdminSession, s.pages.ConsoleSavePolicy)
	con.Post("/policies/:name/delete", s.pages.AdminSession, s.pages.ConsoleDeletePolicy)
	con.Get("/tenants", s.pages.AdminSession, s.pages.ConsoleTenants)
	con.Post("/tenants", s.pages.AdminSession, s.pages.ConsoleCreateTenant)
	con.Get("/tenants/:id", s.pages.AdminSession, s.pages.ConsoleTenant)
	con.Post("/tenants/:id/keys", s.pages.AdminSession, s.pages.ConsoleIssueKey)
	con.Post("/tenants/:id/grants", s.pages.AdminSession, s.pages.ConsoleGrant)
	con.Post("/tenants/:id/tier", s.pages.AdminSession, s.pages.ConsoleSetTier)
	con.Post("/tenants/:id/plan/cancel", s.pages.AdminSession, s.pages.ConsoleCancelPlan)
	con.Post("/tenants/:id/calendar", s.pages.AdminSession, s.pages.ConsoleSetCalendar)
	con.Post("/tenants/:id/credits", s.pages.AdminSession, s.pages.ConsoleAddCredit)
	con.Post("/tenants/:id/spend-cap", s.pages.AdminSession, s.pages.ConsoleSetSpendCap)
	con.Post("/tenants/:id/status", s.pages.AdminSession, s.pages.ConsoleSetStatus)
	con.Post("/keys/:id/revoke", s.pages.AdminSession, s.pages.ConsoleRevokeKey)
	con.Get("/invoices", s.pages.AdminSession, s.pages.ConsoleInvoices)
	con.Get("/invoices.csv", s.pages.AdminSession, s.pages.ConsoleInvoicesCSV)
	con.Get("/alerts", s.pages.AdminSession, s.pages.ConsoleAlerts)
}
