#!/usr/bin/env bash
# shellcheck disable=SC2016 # single-quoted scripts for bash -c / su -c expand there
# services.sh — make Redis and Postgres reachable for `make run` and `make test`.
#
#   eval "$(scripts/services.sh)"   prints `export REDIS_URL='…'` and `export DATABASE_URL='…'`
#   scripts/services.sh stop        stops only the servers this script started
#   scripts/services.sh browser     prints `export TOLLGATE_CHROMIUM='…'`, the headless
#                                   browser of the dashboard tests: TOLLGATE_CHROMIUM
#                                   when set, else chromium (or Chrome) on PATH, else
#                                   Debian's chromium package, installed with apt-get
#   scripts/services.sh wrk         prints `export TOLLGATE_WRK='…'`, the HTTP load
#                                   generator of `make bench`: TOLLGATE_WRK when set,
#                                   else wrk on PATH, else Debian's wrk package,
#                                   installed with apt-get
#   scripts/services.sh stripe-mock prints `export STRIPE_MOCK_URL='…'`, the Stripe API
#                                   mock the Stripe export's tests call: STRIPE_MOCK_URL
#                                   when set, else ours (started earlier) when it runs,
#                                   else one answering on 127.0.0.1:12111, else ours:
#                                   stripe-mock $STRIPE_MOCK_VERSION, installed with
#                                   `go install` into .data/bin when missing, started
#                                   on loopback (12111 or the next free port), its log
#                                   in .data/stripe-mock/
#
# For each of the two, independently:
#   1. REDIS_URL / DATABASE_URL set in the environment: used as is; nothing is
#      installed or started.
#   2. our own server, started earlier by this script, is up: used.
#   3. a server answering on 127.0.0.1:6379 / 127.0.0.1:5432 (Postgres: user
#      postgres, no password) is used.
#   4. otherwise Debian's package (redis-server, postgresql) is installed when
#      missing (apt-get, as root or through password-less sudo) and a server of
#      our own is started on loopback, its data under .data/ (ignored by git):
#      on port 6379 / 5432, or on the next free port when a server we cannot use
#      (one asking for a password) holds it.
# A Redis older than 7.0, found in any of these ways, is refused: Tollgate's Redis
# code is a Redis Function library (FUNCTION LOAD, FCALL: Redis 7.0 and later).
# Stdout carries only the two export lines; every message goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
data=$root/.data
redis_dir=$data/redis
redis_port=6379
pg_port=5432
pg_location=$data/postgres.location # our cluster's data dir, when not $data/postgres
howto_tail="or set REDIS_URL and DATABASE_URL to servers you already have (any Redis 7+ and PostgreSQL 13+ will do)"

# Keep stdout (fd 3) for the export lines; everything else writes to stderr.
# Daemons we start get `3>&- 9>&-`, or `$(scripts/services.sh)` would wait for
# them to exit and they would hold the lock.
exec 3>&1 1>&2

log() { printf 'services: %s\n' "$*" >&2; }
die() {
	printf 'services: error: %s\n' "$*" >&2
	exit 1
}
have() { command -v "$1" >/dev/null 2>&1; }
is_root() { [ "$(id -u)" -eq 0 ]; }
shquote() { printf "'%s'" "${1//\'/\'\\\'\'}"; } # for eval

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() { timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null; }

# --- privileges, packages, lock ------------------------------------------------

can_root() { is_root || { have sudo && sudo -n true 2>/dev/null; }; }
as_root() { if is_root; then "$@"; else sudo -n "$@"; fi; }

apt_updated=0
# apt_install PACKAGE...: installs Debian packages, or exits saying what to install.
apt_install() {
	local howto="install $*: sudo apt-get install $*, $howto_tail"
	have apt-get || die "no apt-get on this machine: $howto"
	can_root || die "not root and no password-less sudo to run apt-get: $howto"
	log "installing $* with apt-get"
	if [ "$apt_updated" = 0 ]; then
		as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update failed: $howto"
		apt_updated=1
	fi
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >&2 ||
		die "apt-get install $* failed: $howto"
}

# lock: one instance at a time starts servers (e.g. two `make test` at once).
lock() {
	mkdir -p "$data"
	chmod 755 "$data" || true # the postgres user must traverse it when we run as root
	if have flock; then
		exec 9>"$data/.lock"
		flock -w 300 9 || die "another scripts/services.sh holds $data/.lock"
	fi
}

# free_port PORT: PORT when nothing listens there, else the next free one.
free_port() {
	local p=$1
	while port_open "$p"; do
		p=$((p + 1))
		[ "$p" -lt $(($1 + 20)) ] || die "no free port in $1..$p on 127.0.0.1"
	done
	echo "$p"
}

# --- Redis -----------------------------------------------------------------------

# redis_ping PORT: a Redis on 127.0.0.1:PORT answers PING with PONG.
redis_ping() {
	if have redis-cli; then
		[ "$(timeout 5 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]
	else
		timeout 5 bash -c '
			exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "PING\r\n" >&3 &&
				IFS= read -r reply <&3 && [[ $reply == +PONG* ]]' _ "$1" 2>/dev/null
	fi
}

# own_redis_port: the port of the Redis this script started, if it runs.
own_redis_port() {
	local pid
	[ -s "$redis_dir/redis.pid" ] || return 1
	pid=$(<"$redis_dir/redis.pid")
	kill -0 "$pid" 2>/dev/null && grep -q redis "/proc/$pid/comm" 2>/dev/null || return 1
	sed -n 's/^port //p' "$redis_dir/redis.conf" 2>/dev/null | grep . || return 1
}

# find_redis: the port of a usable Redis (ours first), or fails.
find_redis() {
	local port
	if port=$(own_redis_port) && redis_ping "$port"; then
		log "Redis: ours answers on 127.0.0.1:$port"
	elif port=$redis_port && redis_ping "$port"; then
		log "Redis: using the one answering on 127.0.0.1:$port"
	else
		return 1
	fi
	echo "$port"
}

# redis_version URL: the version a Redis answers INFO with; nothing when it cannot
# tell (no answer, a password, TLS without redis-cli).
redis_version() {
	local url=$1 hostport
	[[ $url == *://* ]] || url=redis://$url
	if have redis-cli; then
		timeout 5 redis-cli -u "$url" INFO server 2>/dev/null | tr -d '\r' | sed -n 's/^redis_version://p' || true
		return
	fi
	hostport=${url#*://}
	hostport=${hostport##*@}
	hostport=${hostport%%/*}
	timeout 5 bash -c '
		exec 3<>"/dev/tcp/$1/$2" && printf "INFO server\r\n" >&3 || exit
		while IFS= read -r -t 3 line <&3; do
			line=${line%$'"'"'\r'"'"'}
			case $line in redis_version:*) echo "${line#redis_version:}"; exit ;; esac
		done' _ "${hostport%:*}" "${hostport##*:}" 2>/dev/null || true
}

# require_redis7 URL...: stops unless each Redis (REDIS_URL's addresses) is 7.0 or
# later; one whose version cannot be read is let through with a word.
require_redis7() {
	local url v shown
	for url in "$@"; do
		shown=$(printf '%s' "$url" | sed 's#//[^@/]*@#//…@#') # no password in messages
		v=$(redis_version "$url")
		if [ -z "$v" ]; then
			log "Redis: could not read the version of $shown; Tollgate needs Redis 7.0 or later"
		elif ! [ "${v%%.*}" -ge 7 ] 2>/dev/null; then
			die "Redis at $shown is version $v; Tollgate needs Redis 7.0 or later (its Redis code is a Redis Function library): upgrade it, or set REDIS_URL to a Redis 7"
		fi
	done
}

start_redis() {
	local port
	# The package may just have started the system's (systemd), or another
	# instance ours while we waited for the lock.
	find_redis && return
	have redis-server || apt_install redis-server
	have redis-server || die "no redis-server on PATH even after installing redis-server"
	find_redis && return
	port=$(free_port "$redis_port")
	[ "$port" = "$redis_port" ] ||
		log "Redis: 127.0.0.1:$redis_port is held by a server that does not answer PING (a password?); using port $port"
	mkdir -p "$redis_dir"
	cat >"$redis_dir/redis.conf" <<EOF
# Written by scripts/services.sh: a throwaway Redis for development and tests.
bind 127.0.0.1
port $port
protected-mode yes
daemonize yes
dir "$redis_dir"
pidfile "$redis_dir/redis.pid"
logfile "$redis_dir/redis.log"
save ""
appendonly no
EOF
	log "Redis: starting ours on 127.0.0.1:$port (data and log in $redis_dir)"
	rm -f "$redis_dir/redis.pid"
	redis-server "$redis_dir/redis.conf" </dev/null >&2 3>&- 9>&- ||
		die "redis-server did not start; see $redis_dir/redis.log"
	for _ in $(seq 100); do
		redis_ping "$port" && { echo "$port"; return; }
		sleep 0.2
	done
	tail -n 20 "$redis_dir/redis.log" >&2 || true
	die "our Redis does not answer PING on 127.0.0.1:$port after 20s; see $redis_dir/redis.log"
}

stop_redis() {
	local pid
	if ! own_redis_port >/dev/null; then
		log "Redis: none of ours is running"
		return 0
	fi
	pid=$(<"$redis_dir/redis.pid")
	log "Redis: stopping ours (pid $pid)"
	kill -TERM "$pid"
	for _ in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.2
	done
	die "our Redis (pid $pid) did not stop within 20s"
}

# --- Postgres --------------------------------------------------------------------

pgbin="" # the newest installed server binaries
find_pgbin() {
	local d
	# shellcheck disable=SC2012
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	if [ -n "$d" ] && [ -x "$d/initdb" ]; then
		pgbin=$d
	elif have initdb && have pg_ctl; then # not Debian
		pgbin=$(dirname "$(command -v pg_ctl)")
	else
		return 1
	fi
}

# pg_dir: the data directory of our own cluster.
pg_dir() { if [ -s "$pg_location" ]; then cat "$pg_location"; else echo "$data/postgres"; fi; }

# as_pg CMD...: runs CMD as our cluster's owner: the postgres user when we are
# root, since initdb and postgres refuse to run as root.
as_pg() {
	if ! is_root; then
		"$@"
	elif have runuser; then
		(cd / && runuser -u postgres -- "$@")
	else
		(cd / && su -s /bin/sh -c '"$0" "$@"' postgres -- "$@")
	fi
}

# own_pg_port: the port of the cluster this script started, if it runs.
own_pg_port() {
	local pid port
	{ read -r pid && read -r _ && read -r _ && read -r port; } 2>/dev/null <"$(pg_dir)/postmaster.pid" || return 1
	kill -0 "$pid" 2>/dev/null || return 1
	echo "$port"
}

# pg_sql PORT SQL: runs SQL as user postgres over TCP, never asking for a password.
pg_sql() {
	local psql=psql
	[ -x "$pgbin/psql" ] && psql=$pgbin/psql
	PGCONNECT_TIMEOUT=5 "$psql" -X -w -q -h 127.0.0.1 -p "$1" -U postgres -d postgres \
		-v ON_ERROR_STOP=1 -tAc "$2"
}

# pg_usable PORT: a Postgres on 127.0.0.1:PORT lets user postgres in without a password.
pg_usable() {
	if have pg_isready; then
		pg_isready -q -h 127.0.0.1 -p "$1" -t 5 || return 1
	else
		port_open "$1" || return 1
	fi
	[ "$(pg_sql "$1" 'select 1' 2>/dev/null)" = 1 ]
}

# find_pg: the port of a usable Postgres (ours first), or fails.
find_pg() {
	local port
	if port=$(own_pg_port) && pg_usable "$port"; then
		log "Postgres: ours answers on 127.0.0.1:$port ($(pg_dir))"
	elif port=$pg_port && { have psql || [ -x "$pgbin/psql" ]; } && pg_usable "$port"; then
		log "Postgres: using the one answering on 127.0.0.1:$port"
	else
		return 1
	fi
	echo "$port"
}

start_postgres() {
	local dir sock pglog port
	find_pg && return # see start_redis
	if [ -z "$pgbin" ]; then
		apt_install postgresql
		find_pgbin || die "no initdb in /usr/lib/postgresql/*/bin after installing postgresql"
		find_pg && return
	fi
	if is_root && ! id postgres >/dev/null 2>&1; then
		die "as root, Postgres must run as the postgres user, and there is none: install postgresql (sudo apt-get install postgresql), run as a normal user, $howto_tail"
	fi

	dir=$(pg_dir)
	if is_root && [ "$dir" = "$data/postgres" ] && ! runuser -u postgres -- test -x "$data" 2>/dev/null; then
		dir=/var/lib/postgresql/tollgate-$(printf '%s' "$root" | sha256sum | cut -c1-12)
		log "Postgres: the postgres user cannot reach $data, so our cluster lives in $dir"
		echo "$dir" >"$pg_location"
	fi
	sock=$dir-run # .data/postgres-run, or next to the data dir elsewhere
	pglog=$dir.log
	# A Unix socket path has at most ~107 bytes; without room, TCP only.
	[ "${#sock}" -le 90 ] || sock=""

	mkdir -p "$dir" ${sock:+"$sock"}
	touch "$pglog"
	if is_root; then chown postgres: "$dir" "$pglog" ${sock:+"$sock"}; fi
	chmod 700 "$dir"
	if [ ! -s "$dir/PG_VERSION" ]; then
		log "Postgres: creating our cluster in $dir ($pgbin)"
		as_pg "$pgbin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 --no-locale >>"$pglog" 2>&1 3>&- 9>&- || {
			tail -n 20 "$pglog" >&2 || true
			die "initdb failed for $dir; see $pglog"
		}
	fi
	port=$(free_port "$pg_port")
	[ "$port" = "$pg_port" ] ||
		log "Postgres: 127.0.0.1:$pg_port is held by a server that wants a password for user postgres; using port $port"
	log "Postgres: starting ours on 127.0.0.1:$port (log $pglog)"
	as_pg "$pgbin/pg_ctl" -D "$dir" -o "-h 127.0.0.1 -p $port -k '$sock'" -l "$pglog" -w -t 60 start \
		</dev/null >&2 3>&- 9>&- || {
		tail -n 20 "$pglog" >&2 || true
		die "our Postgres did not start; see $pglog"
	}
	pg_usable "$port" || die "our Postgres started but user postgres cannot connect on 127.0.0.1:$port; see $pglog"
	echo "$port"
}

stop_postgres() {
	if ! own_pg_port >/dev/null; then
		log "Postgres: none of ours is running"
		return 0
	fi
	find_pgbin || die "no pg_ctl to stop our cluster in $(pg_dir)"
	log "Postgres: stopping ours ($(pg_dir))"
	as_pg "$pgbin/pg_ctl" -D "$(pg_dir)" -m fast -w -t 60 stop >&2
}

# ensure_database PORT: the database tollgate exists.
ensure_database() {
	local q="select 1 from pg_database where datname = 'tollgate'"
	[ -n "$(pg_sql "$1" "$q")" ] && return
	log "Postgres: creating database tollgate"
	pg_sql "$1" 'CREATE DATABASE tollgate' >/dev/null 2>&1 || [ -n "$(pg_sql "$1" "$q")" ] ||
		die "cannot create database tollgate on 127.0.0.1:$1"
}

# --- the dashboard tests' browser ---------------------------------------------------

# find_browser: the path of a Chromium or Chrome on PATH, or fails.
find_browser() {
	local b
	for b in chromium chromium-browser google-chrome google-chrome-stable; do
		command -v "$b" && return
	done
	return 1
}

browser() {
	local path
	if [ -n "${TOLLGATE_CHROMIUM:-}" ]; then
		path=$(command -v "$TOLLGATE_CHROMIUM") || die "TOLLGATE_CHROMIUM=$TOLLGATE_CHROMIUM is not an executable"
	elif ! path=$(find_browser); then
		howto_tail="or set TOLLGATE_CHROMIUM to a Chromium or Chrome you already have"
		lock
		path=$(find_browser) || {
			apt_install chromium
			path=$(find_browser) || die "chromium was installed but is not on PATH"
		}
	fi
	log "browser: $path"
	printf 'export TOLLGATE_CHROMIUM=%s\n' "$(shquote "$path")" >&3
}

# --- the bench's load generator ------------------------------------------------------

bench_wrk() {
	local path
	if [ -n "${TOLLGATE_WRK:-}" ]; then
		path=$(command -v "$TOLLGATE_WRK") || die "TOLLGATE_WRK=$TOLLGATE_WRK is not an executable"
	elif ! path=$(command -v wrk); then
		howto_tail="or set TOLLGATE_WRK to a wrk you already have"
		lock
		path=$(command -v wrk) || {
			apt_install wrk
			path=$(command -v wrk) || die "wrk was installed but is not on PATH"
		}
	fi
	log "wrk: $path"
	printf 'export TOLLGATE_WRK=%s\n' "$(shquote "$path")" >&3
}

# --- the Stripe export tests' Stripe API mock ---------------------------------------

stripe_mock_version=${STRIPE_MOCK_VERSION:-v0.203.0}
stripe_mock_dir=$data/stripe-mock
stripe_mock_port=12111

# stripe_mock_ok PORT: a stripe-mock on 127.0.0.1:PORT answers GET /v1/balance.
stripe_mock_ok() {
	timeout 5 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf "GET /v1/balance HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk_test_services\r\nConnection: close\r\n\r\n" >&3
		IFS= read -r status <&3 && [[ $status == "HTTP/1.1 200"* ]]' _ "$1" 2>/dev/null
}

# own_stripe_mock_port: the port of the stripe-mock this script started, if it runs.
own_stripe_mock_port() {
	local pid port
	[ -s "$stripe_mock_dir/pid" ] && [ -s "$stripe_mock_dir/port" ] || return 1
	pid=$(<"$stripe_mock_dir/pid") port=$(<"$stripe_mock_dir/port")
	kill -0 "$pid" 2>/dev/null && grep -q stripe-mock "/proc/$pid/comm" 2>/dev/null || return 1
	echo "$port"
}

# find_stripe_mock: the port of a usable stripe-mock (ours first), or fails.
find_stripe_mock() {
	local port
	if port=$(own_stripe_mock_port) && stripe_mock_ok "$port"; then
		log "stripe-mock: ours answers on 127.0.0.1:$port"
	elif port=$stripe_mock_port && stripe_mock_ok "$port"; then
		log "stripe-mock: using the one answering on 127.0.0.1:$port"
	else
		return 1
	fi
	echo "$port"
}

start_stripe_mock() {
	local bin=$data/bin/stripe-mock port pid
	# (reinstalled when it is another version than the pinned one)
	if [ ! -x "$bin" ] || { have go && ! go version -m "$bin" 2>/dev/null |
		grep -q "mod[[:space:]]*github.com/stripe/stripe-mock[[:space:]]*$stripe_mock_version"; }; then
		have go || die "no go on PATH to install stripe-mock: install Go, or set STRIPE_MOCK_URL to a stripe-mock you run"
		log "stripe-mock: installing $stripe_mock_version into $data/bin"
		mkdir -p "$data/bin"
		GOBIN=$data/bin go install "github.com/stripe/stripe-mock@$stripe_mock_version" >&2 ||
			die "go install github.com/stripe/stripe-mock@$stripe_mock_version failed; or set STRIPE_MOCK_URL to a stripe-mock you run"
	fi
	port=$(free_port "$stripe_mock_port")
	mkdir -p "$stripe_mock_dir"
	log "stripe-mock: starting ours on 127.0.0.1:$port (log $stripe_mock_dir/log)"
	# setsid: it outlives this script and the make that ran it, like our Redis.
	setsid "$bin" -http-addr "127.0.0.1:$port" </dev/null >"$stripe_mock_dir/log" 2>&1 3>&- 9>&- &
	pid=$!
	echo "$pid" >"$stripe_mock_dir/pid"
	echo "$port" >"$stripe_mock_dir/port"
	for _ in $(seq 100); do
		stripe_mock_ok "$port" && { echo "$port"; return; }
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.2
	done
	tail -n 20 "$stripe_mock_dir/log" >&2 || true
	die "our stripe-mock does not answer on 127.0.0.1:$port; see $stripe_mock_dir/log"
}

stop_stripe_mock() {
	local pid
	if ! own_stripe_mock_port >/dev/null; then
		log "stripe-mock: none of ours is running"
		return 0
	fi
	pid=$(<"$stripe_mock_dir/pid")
	log "stripe-mock: stopping ours (pid $pid)"
	kill -TERM "$pid"
	for _ in $(seq 50); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.2
	done
	die "our stripe-mock (pid $pid) did not stop within 10s"
}

stripe_mock() {
	local url port
	if [ -n "${STRIPE_MOCK_URL:-}" ]; then
		log "stripe-mock: using STRIPE_MOCK_URL from the environment"
		url=$STRIPE_MOCK_URL
	else
		if ! port=$(find_stripe_mock); then
			lock
			port=$(find_stripe_mock) || port=$(start_stripe_mock)
		fi
		url=http://127.0.0.1:$port
	fi
	printf 'export STRIPE_MOCK_URL=%s\n' "$(shquote "$url")" >&3
}

# --- main ------------------------------------------------------------------------

find_pgbin || true
case "${1:-up}" in
up) ;;
browser)
	browser
	exit 0
	;;
wrk)
	bench_wrk
	exit 0
	;;
stripe-mock)
	stripe_mock
	exit 0
	;;
stop)
	stop_redis
	stop_postgres
	stop_stripe_mock
	exit 0
	;;
*) die "usage: scripts/services.sh [up|stop|browser|wrk|stripe-mock]" ;;
esac

# Find what there is; say at once everything that is missing.
need=() rport="" pport=""
if [ -n "${REDIS_URL:-}" ]; then
	log "Redis: using REDIS_URL from the environment"
	IFS=, read -ra redis_urls <<<"$REDIS_URL"
	require_redis7 "${redis_urls[@]}"
elif ! rport=$(find_redis); then
	have redis-server || need+=(redis-server)
else
	require_redis7 "redis://127.0.0.1:$rport/0"
fi
if [ -n "${DATABASE_URL:-}" ]; then
	log "Postgres: using DATABASE_URL from the environment"
elif ! pport=$(find_pg); then
	if ! have psql && [ -z "$pgbin" ] && port_open "$pg_port"; then
		need+=(postgresql-client) # to try the server answering on $pg_port first
	elif [ -z "$pgbin" ]; then
		need+=(postgresql)
	fi
fi
if { [ -z "${REDIS_URL:-}" ] && [ -z "$rport" ]; } || { [ -z "${DATABASE_URL:-}" ] && [ -z "$pport" ]; }; then
	lock
fi
if [ "${#need[@]}" -gt 0 ]; then apt_install "${need[@]}"; fi
if [ -z "${REDIS_URL:-}" ]; then
	if [ -z "$rport" ]; then
		rport=$(start_redis)
		require_redis7 "redis://127.0.0.1:$rport/0"
	fi
	REDIS_URL=redis://127.0.0.1:$rport/0
fi
if [ -z "${DATABASE_URL:-}" ]; then
	[ -n "$pport" ] || pport=$(start_postgres)
	ensure_database "$pport"
	DATABASE_URL="postgres://postgres@127.0.0.1:$pport/tollgate?sslmode=disable"
fi

printf 'export REDIS_URL=%s\nexport DATABASE_URL=%s\n' "$(shquote "$REDIS_URL")" "$(shquote "$DATABASE_URL")" >&3
