#!/usr/bin/env bash
# services.sh — make Redis and Postgres reachable for `make run` and `make test`.
#
#   eval "$(scripts/services.sh)"   prints `export REDIS_URL=…` and `export DATABASE_URL=…`
#   scripts/services.sh stop        stops only the servers this script started
#
# For each of the two: a URL given in the environment is used as it is and
# nothing is installed. Otherwise a server already answering on the default
# port (Redis 127.0.0.1:6379, Postgres 127.0.0.1:5432 with user postgres) is
# used. Otherwise Debian's package is installed when missing (apt-get, as root
# or through sudo) and a server of our own is started on that port, its data
# under .data/ (ignored by git). Logs go to stderr; stdout carries only the
# export lines.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
data="$root/.data"
redis_port=6379
pg_port=5432
db_name=tollgate

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"
  else return 1
  fi
}

apt_updated=""
install_pkg() { # install_pkg <debian package> <what it is for>
  command -v apt-get >/dev/null 2>&1 ||
    die "$2 is not installed and there is no apt-get here: install $1, or set REDIS_URL and DATABASE_URL"
  log "installing $1 with apt-get"
  if [ -z "$apt_updated" ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 ||
      die "cannot run apt-get as root: run 'sudo apt-get install -y $1', or set REDIS_URL and DATABASE_URL"
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >&2 ||
    die "apt-get install $1 failed: install it by hand, or set REDIS_URL and DATABASE_URL"
}

# --- Redis -------------------------------------------------------------------

redis_answers() { # redis_answers <port>
  if command -v redis-cli >/dev/null 2>&1; then
    [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'PING\r\n' >&3 && IFS= read -r -t 2 line <&3 && [[ "$line" == +PONG* ]]) 2>/dev/null
  fi
}

ensure_redis() {
  if [ -n "${REDIS_URL:-}" ]; then echo "$REDIS_URL"; return; fi
  local url="redis://127.0.0.1:$redis_port/0"
  if redis_answers "$redis_port"; then echo "$url"; return; fi
  command -v redis-server >/dev/null 2>&1 || install_pkg redis-server "Redis"
  mkdir -p "$data/redis"
  log "starting redis-server on 127.0.0.1:$redis_port (data in .data/redis)"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$redis_port" --dir "$data/redis" \
    --pidfile "$data/redis/redis.pid" --logfile "$data/redis/redis.log" \
    --save "" --appendonly no >&2 || die "redis-server did not start; see .data/redis/redis.log"
  for _ in $(seq 100); do
    redis_answers "$redis_port" && { echo "$url"; return; }
    sleep 0.2
  done
  die "redis-server did not answer on 127.0.0.1:$redis_port within 20s; see .data/redis/redis.log"
}

# --- Postgres ----------------------------------------------------------------

pg_bin() { # the newest installed server binaries
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

pg_answers() {
  if command -v psql >/dev/null 2>&1; then
    psql -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -tAc 'select 1' >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$pg_port") 2>/dev/null
  fi
}

# run_pg runs a server binary as the postgres OS user when we are root
# (initdb and postgres refuse to run as root).
run_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

ensure_postgres() {
  if [ -n "${DATABASE_URL:-}" ]; then echo "$DATABASE_URL"; return; fi
  local url="postgres://postgres@127.0.0.1:$pg_port/$db_name?sslmode=disable"
  if ! pg_answers; then
    [ -n "$(pg_bin)" ] || install_pkg postgresql "Postgres"
    command -v psql >/dev/null 2>&1 || install_pkg postgresql-client "the Postgres client"
    local bin dir="$data/postgres" sock="$data/postgres-run"
    bin=$(pg_bin)
    [ -n "$bin" ] || die "no Postgres server binaries under /usr/lib/postgresql: install postgresql"
    mkdir -p "$dir" "$sock"
    if [ "$(id -u)" = 0 ]; then
      id postgres >/dev/null 2>&1 || die "no postgres OS user: install the postgresql package"
      chown postgres "$dir" "$sock"
      chmod 700 "$dir"
      runuser -u postgres -- test -x "$dir" ||
        die "the postgres user cannot reach $dir: move the checkout somewhere it can read, or set DATABASE_URL"
    fi
    if [ ! -f "$dir/PG_VERSION" ]; then
      log "initialising a Postgres cluster in .data/postgres"
      run_pg "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >&2
    fi
    log "starting Postgres on 127.0.0.1:$pg_port (data in .data/postgres)"
    run_pg "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
      -o "-h 127.0.0.1 -p $pg_port -k $sock" start >&2 ||
      die "Postgres did not start; see .data/postgres/server.log"
    pg_answers || die "Postgres does not answer on 127.0.0.1:$pg_port; see .data/postgres/server.log"
  fi
  if [ -z "$(psql -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -tAc "select 1 from pg_database where datname = '$db_name'")" ]; then
    psql -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -qc "CREATE DATABASE $db_name" >&2
  fi
  echo "$url"
}

stop_ours() {
  if [ -f "$data/redis/redis.pid" ] && kill -0 "$(cat "$data/redis/redis.pid")" 2>/dev/null; then
    log "stopping our redis-server"
    kill "$(cat "$data/redis/redis.pid")"
  fi
  if [ -f "$data/postgres/postmaster.pid" ]; then
    log "stopping our Postgres"
    run_pg "$(pg_bin)/pg_ctl" -D "$data/postgres" -m fast -w stop >&2 || true
  fi
}

case "${1:-up}" in
  up)
    r=$(ensure_redis)
    p=$(ensure_postgres)
    printf "export REDIS_URL='%s'\nexport DATABASE_URL='%s'\n" "$r" "$p"
    ;;
  stop) stop_ours ;;
  *) die "usage: $0 [up|stop]" ;;
esac
