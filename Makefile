# Tollgate — the two set-up commands are `make run` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
GO ?= go
TESTFLAGS ?=
ADDR ?= 127.0.0.1:8080
# Local services: scripts/services.sh uses REDIS_URL/DATABASE_URL when set,
# else the servers on the default ports, else installs and starts its own.
SERVICES = eval "$$(scripts/services.sh)"

.PHONY: run test bench build services services-stop clean

## run: start Redis/Postgres if needed, migrate, print a demo key, run api + worker until Ctrl-C
run: build
	@$(SERVICES); \
	mkdir -p .data; \
	token() { [ -s "$$1" ] || od -An -tx1 -N16 /dev/urandom | tr -d ' \n' > "$$1"; cat "$$1"; }; \
	export TOLLGATE_ADMIN_TOKEN="$${TOLLGATE_ADMIN_TOKEN:-$$(token .data/admin_token)}"; \
	export TOLLGATE_SERVICE_TOKEN="$${TOLLGATE_SERVICE_TOKEN:-$$(token .data/service_token)}"; \
	export TOLLGATE_ADDR="$${TOLLGATE_ADDR:-$(ADDR)}"; \
	export TOLLGATE_LOG_FORMAT="$${TOLLGATE_LOG_FORMAT:-text}"; \
	bin/seed; \
	bin/worker & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT; \
	bin/api

## test: go vet, then every test with -race against real Redis and Postgres
test:
	@$(SERVICES); \
	$(GO) vet ./... && \
	$(GO) test -race -count=1 -timeout 30m $(TESTFLAGS) ./...

## bench: the Go benchmarks, then the HTTP load test against a local api
bench: build
	@$(SERVICES); \
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./internal/ratelimit/

## build: the binaries in bin/
build:
	$(GO) build -o bin/ ./cmd/...

## services: just start (or find) Redis and Postgres and print their URLs
services:
	@scripts/services.sh

## services-stop: stop the servers scripts/services.sh started (never system ones)
services-stop:
	@scripts/services.sh stop

clean:
	rm -rf bin
