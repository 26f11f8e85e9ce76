# Tollgate — the two set-up commands are `make run` and `make test`.
# scripts/services.sh makes Redis and Postgres reachable (using REDIS_URL and
# DATABASE_URL when set, else local servers, else installing and starting its
# own under .data/) and prints the two URLs to export.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
PKGS ?= ./...
TESTFLAGS ?=
BENCHFLAGS ?=

# `svc=$(…) && eval` rather than `eval "$(…)"`, which would ignore a failure.
SERVICES = svc=$$(scripts/services.sh) && eval "$$svc"
# The headless Chromium of the dashboard's browser tests (installed when missing).
BROWSER = brw=$$(scripts/services.sh browser) && eval "$$brw"
# wrk, the bench's load generator, and its tests' (installed when missing).
WRK = wrk=$$(scripts/services.sh wrk) && eval "$$wrk"
# stripe-mock, the Stripe API the Stripe export's tests call (installed and started when missing).
STRIPE_MOCK = stripe=$$(scripts/services.sh stripe-mock) && eval "$$stripe"
# golangci-lint at its pinned version in .data/bin (installed when missing), then
# run on the root module and on the Go SDK's (.golangci.yml; SDK= leaves it out).
LINT = lint=$$(scripts/tools.sh golangci-lint) && eval "$$lint" && \
	"$$TOLLGATE_GOLANGCI_LINT" run $(PKGS) && \
	if [ -n "$(SDK)" ]; then (cd $(SDK) && "$$TOLLGATE_GOLANGCI_LINT" run --config "$(CURDIR)/.golangci.yml" ./...); fi
# $(call token,VAR,FILE): keep VAR from the environment, else read it from
# .data/FILE, made once with 32 random hex characters.
token = if [ -z "$${$(1):-}" ]; then \
	  [ -s .data/$(2) ] || (umask 077; mkdir -p .data; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >.data/$(2)); \
	  $(1)=$$(<.data/$(2)); \
	fi; export $(1)

.PHONY: run test test-unit lint bench bench-load soak mutate build generate services services-stop clean

## run: start Redis/Postgres if needed, migrate, print a demo key, run the api and worker until Ctrl-C
run: build
	@$(SERVICES); \
	$(call token,TOLLGATE_ADMIN_TOKEN,admin_token); \
	$(call token,TOLLGATE_SERVICE_TOKEN,service_token); \
	export TOLLGATE_ADDR="$${TOLLGATE_ADDR:-127.0.0.1:8080}"; \
	export TOLLGATE_LOG_FORMAT="$${TOLLGATE_LOG_FORMAT:-text}"; \
	bin/seed; \
	bin/worker & worker=$$!; \
	trap 'kill $$worker 2>/dev/null || true; wait $$worker 2>/dev/null || true' EXIT; \
	bin/api

# SDK: the Go SDK's module (its own go.mod, which `go test ./...` at the
# root skips), vetted and tested after the root's; SDK= leaves it out.
SDK ?= sdk/go

## test: go vet and golangci-lint, then every test with -race against real Redis, Postgres, a headless Chromium, wrk and stripe-mock; then the Go SDK's
test:
	@$(SERVICES) && $(BROWSER) && $(WRK) && $(STRIPE_MOCK) && $(GO) vet $(PKGS) && \
	if [ -n "$(SDK)" ]; then $(GO) -C $(SDK) vet ./...; fi && \
	$(LINT) && \
	$(GO) test -race -count=1 -timeout 30m $(TESTFLAGS) $(PKGS) && \
	if [ -n "$(SDK)" ]; then $(GO) -C $(SDK) test -race -count=1 -timeout 10m $(TESTFLAGS) ./...; fi

## test-unit: the unit tests alone (go test -short), root module and Go SDK, in seconds: no Redis, Postgres or other service
# -short skips every test that needs a service (internal/testenv's helpers, and
# the tests that start one themselves), whether it is reachable or not;
# `make test` runs them all.
test-unit:
	@$(GO) test -short -count=1 $(TESTFLAGS) $(PKGS) && \
	if [ -n "$(SDK)" ]; then $(GO) -C $(SDK) test -short -count=1 $(TESTFLAGS) ./...; fi

## lint: golangci-lint (.golangci.yml) on the root module and the Go SDK, installed at its pinned version by scripts/tools.sh
lint:
	@$(LINT)

## bench: the Go benchmarks, then bench-load (its table and goals last)
bench: build
	@$(SERVICES) && $(GO) test -run '^$$' -bench . -benchmem -benchtime 2s $(BENCHFLAGS) $(PKGS)
	@$(MAKE) --no-print-directory bench-load

## bench-load: bare Fiber, Fiber + redis_rate and the api side by side on loopback, driven by wrk, one table with the goals
# The api serves gRPC on BENCH_GRPC_ADDR too: the table's last row drives the rate limit
# service's ShouldRateLimit with loadgen's own gRPC client (BENCH_GRPC_ADDR= leaves it out,
# for an api built before it).
# The two reference servers are bin/loadgen -peer (internal/httpapi/benchpeer); the
# api is bin/api; Debian's wrk (scripts/services.sh wrk installs it when missing)
# drives the closed-loop rows, bin/loadgen the open loop, and prints req/s, p50/p99,
# ratios, the Redis cost of an admission, CPU per request and each goal as PASS or
# FAIL. Everything this target starts stops on exit, even on failure.
# LOADFLAGS='-duration 2s' for a quicker run. The load comes from one address,
# whose connections the api's cap per address would refuse: TOLLGATE_MAX_CONNS_PER_IP=0.
# BENCH_REDIS_PORT: the bench runs its own Redis there (loopback, no persistence),
# so that INFO commandstats counts the bench's commands alone; empty: the Redis of
# REDIS_URL (or of scripts/services.sh), whose other clients then count too.
BENCH_ADDR ?= 127.0.0.1:18080
BENCH_BARE_ADDR ?= 127.0.0.1:18081
BENCH_REDIS_RATE_ADDR ?= 127.0.0.1:18082
BENCH_GRPC_ADDR ?= 127.0.0.1:18083
BENCH_REDIS_PORT ?= 18379
LOADFLAGS ?= -duration 5s -conns 64 -threads 2 -tenants 400
# API_BIN: the api binary to measure (another build, to compare two versions).
API_BIN ?= bin/api
bench-load: build
	@$(SERVICES) && $(WRK) || exit 1; \
	export TOLLGATE_ADDR=$(BENCH_ADDR) TOLLGATE_GRPC_ADDR=$(BENCH_GRPC_ADDR) TOLLGATE_REDIS_PREFIX=bench TOLLGATE_LOG_LEVEL=warn TOLLGATE_MAX_CONNS_PER_IP=0 \
		TOLLGATE_SERVICE_TOKEN=bench-service-token-0123456789 TOLLGATE_ADMIN_TOKEN=bench-admin-token-0123456789; \
	pids="" redis=""; \
	trap 'kill $$pids 2>/dev/null || true; wait $$pids 2>/dev/null || true; \
		if [ -n "$$redis" ]; then kill $$redis 2>/dev/null || true; wait $$redis 2>/dev/null || true; fi' EXIT; \
	if [ -n "$(BENCH_REDIS_PORT)" ]; then \
		command -v redis-server >/dev/null || { echo "bench: no redis-server for the bench's own Redis; BENCH_REDIS_PORT= uses REDIS_URL's" >&2; exit 1; }; \
		if (exec 3<>/dev/tcp/127.0.0.1/$(BENCH_REDIS_PORT)) 2>/dev/null; then \
			echo "bench: 127.0.0.1:$(BENCH_REDIS_PORT) is taken; choose another BENCH_REDIS_PORT" >&2; exit 1; fi; \
		redis-server --bind 127.0.0.1 --port $(BENCH_REDIS_PORT) --save '' --appendonly no --loglevel warning >/dev/null & \
		redis=$$!; \
		for _ in $$(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$(BENCH_REDIS_PORT)) 2>/dev/null && break; sleep 0.1; done; \
		kill -0 $$redis 2>/dev/null || { echo "bench: the bench's Redis did not start on 127.0.0.1:$(BENCH_REDIS_PORT)" >&2; exit 1; }; \
		export REDIS_URL=redis://127.0.0.1:$(BENCH_REDIS_PORT)/0; \
		echo "bench: a Redis of its own on 127.0.0.1:$(BENCH_REDIS_PORT), stopped last ($$(redis-server --version | sed 's/ sha=.*//'))" >&2; \
	fi; \
	bin/loadgen -peer bare -addr $(BENCH_BARE_ADDR) & bare=$$!; pids="$$pids $$bare"; \
	bin/loadgen -peer redis_rate -addr $(BENCH_REDIS_RATE_ADDR) & redis_rate=$$!; pids="$$pids $$redis_rate"; \
	$(API_BIN) & pids="$$pids $$!"; \
	bin/loadgen -url http://$(BENCH_ADDR) -bare http://$(BENCH_BARE_ADDR) -redis-rate http://$(BENCH_REDIS_RATE_ADDR) $(if $(BENCH_GRPC_ADDR),-grpc $(BENCH_GRPC_ADDR)) \
		-wrk "$$TOLLGATE_WRK" -bare-pid $$bare -redis-rate-pid $$redis_rate $(LOADFLAGS)

## soak: 2 api nodes and 2 workers on their own Redis (append-only) and Postgres under load, with faults; audits the promises
# bin/soak starts its own redis-server and Postgres cluster (initdb) on free loopback
# ports, its data and the processes' logs under .data/soak, and stops everything it
# started when it ends. SOAK_DURATION (10m) is how long the load runs; docs/soak.md.
SOAK_DURATION ?= 10m
soak: build
	@SOAK_DURATION=$(SOAK_DURATION) bin/soak

## mutate: mutation testing (gremlins) of the pure domain packages; fails below 90 % efficacy
# Slow (minutes a package), so not part of `make test`. scripts/mutate.sh
# installs gremlins at its pinned version into .data/bin, skips a package
# that does not exist, and needs no Redis or Postgres: these packages do no
# I/O. MUTATE_PKGS='internal/quota' for one.
MUTATE_PKGS ?= internal/quota internal/limits
mutate:
	@scripts/mutate.sh $(MUTATE_PKGS)

## generate: regenerate the Go SDK's admin client from internal/httpapi/openapi.json (oapi-codegen)
generate:
	$(GO) -C sdk/go/admin generate ./...

## build: the binaries api, worker and seed in bin/
build:
	$(GO) build -o bin/ ./cmd/...

## services: find or start Redis and Postgres and print their URLs
services:
	@scripts/services.sh

## services-stop: stop the servers scripts/services.sh started, stripe-mock too (never system ones)
services-stop:
	@scripts/services.sh stop

clean:
	rm -rf bin
