// Package arch holds no code: its test checks the module's import graph
// against the layering the project keeps (STYLE.md, points 2, 3 and 19), so
// that a change that breaks it fails `go test ./...` instead of a review.
//
// The rules, each a subtest of TestArchitecture, read the non-test imports of
// every package (`go list -json ./...` at the module root):
//
//   - The domain, internal/quota, imports no package of this module and
//     nothing of Redis (github.com/redis/...), Postgres (github.com/jackc/...,
//     github.com/golang-migrate/...) or HTTP (github.com/gofiber/...,
//     github.com/valyala/..., net/http and below).
//   - Adapters do not import one another. The adapters are the Redis side of
//     quota state, internal/pgdb (the Postgres pool and migrations),
//     internal/catalogdb (the catalog's store), internal/redisdb (the Redis
//     connection) and the HTTP layer, internal/httpapi and every
//     package under it, which counts as one adapter: its subpackages may
//     import each other. The Redis side counts as one adapter too:
//     internal/redisfn (the Function library and the key layout), the
//     parts on it (internal/ratelimit, internal/pending,
//     internal/settlement, internal/idempotency) and internal/quotaredis,
//     which joins them.
//   - The Redis parts import internal/redisfn and not one another;
//     internal/redisfn imports none of them.
//   - No package outside the HTTP layer imports Fiber (github.com/gofiber/...),
//     cmd/* included. (cmd/loadgen drives its load with fasthttp's client,
//     which is not a server framework.)
//   - No package holds more than a quarter of the module's non-test Go lines,
//     counted over the packages under cmd/ and internal/.
//   - The services (internal/admission, internal/billing, internal/catalog,
//     internal/usage, internal/worker, internal/locallimit, internal/policyalg) do not import
//     the Redis side, internal/pgdb, internal/catalogdb or the HTTP layer;
//     they declare the small interfaces they consume and internal/app wires
//     the adapters in. Their tests may import adapters: only non-test imports are checked.
//   - The HTTP layer and internal/envoy reach quota state through the
//     admission use case: internal/httpapi imports internal/admission, and
//     neither imports the Redis side, internal/redisdb, internal/limits
//     or internal/policyalg.
//   - The binaries' start-up is internal/app's: cmd/api and cmd/worker import
//     no package of this module but internal/app (cmd/api also
//     internal/config, for its health check), and no other package imports
//     internal/app (the end-to-end tests do, from their test files).
//   - internal/app imports no binary and none of the tests' packages:
//     internal/testenv, internal/arch, internal/e2e and below.
//   - The end-to-end suites, internal/e2e/api and internal/e2e/worker, hold
//     tests only: no non-test file but their package doc (doc.go), no
//     non-test import, and no package imports them. A package under
//     internal/e2e that the rule does not list fails it.
//
// Every package a rule names must exist, so that renaming one fails the test
// rather than silently voiding the rule.
package arch
