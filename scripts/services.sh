#!/usr/bin/env bash
# Sourced by the project's scripts: checks, and starts where it can, the
# services the tests and demos need. Idempotent: a service that already
# answers is left alone. Every function fails loudly (non-zero) when a
# service cannot be had.

: "${FENCE_POSTGRES_URL:=postgres://postgres@127.0.0.1:5432/test?sslmode=disable}"
: "${FENCE_REDIS_URL:=redis://127.0.0.1:6379/0}"
export FENCE_POSTGRES_URL FENCE_REDIS_URL

log() { printf '[services] %s\n' "$*" >&2; }

# ensure_redis: Redis answers PING at FENCE_REDIS_URL, starting the local
# server without persistence if it is the default address and is down.
ensure_redis() {
  if ! command -v redis-cli >/dev/null 2>&1; then
    log "redis-cli not found: install Redis (Debian: apt-get install redis-server) or set FENCE_REDIS_URL"
    return 1
  fi
  if [ "$(redis-cli -u "$FENCE_REDIS_URL" ping 2>/dev/null)" = "PONG" ]; then
    log "Redis: $FENCE_REDIS_URL answers"
    return 0
  fi
  if [ "$FENCE_REDIS_URL" = "redis://127.0.0.1:6379/0" ] && command -v redis-server >/dev/null 2>&1; then
    log "Redis: not answering, starting redis-server on 127.0.0.1:6379"
    mkdir -p /tmp/fencekit-redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /tmp/fencekit-redis --logfile /tmp/fencekit-redis/redis.log >/dev/null
    for _ in $(seq 1 50); do
      [ "$(redis-cli -u "$FENCE_REDIS_URL" ping 2>/dev/null)" = "PONG" ] && { log "Redis: started"; return 0; }
      sleep 0.1
    done
  fi
  log "Redis: nothing answers at $FENCE_REDIS_URL; start Redis or set FENCE_REDIS_URL"
  return 1
}

# ensure_postgres: PostgreSQL accepts a query at FENCE_POSTGRES_URL, starting
# the machine's cluster if it is the default address and is down.
ensure_postgres() {
  if ! command -v psql >/dev/null 2>&1; then
    log "psql not found: install PostgreSQL (Debian: apt-get install postgresql) or set FENCE_POSTGRES_URL"
    return 1
  fi
  if psql "$FENCE_POSTGRES_URL" -qAtc 'select 1' >/dev/null 2>&1; then
    log "PostgreSQL: $FENCE_POSTGRES_URL answers"
    return 0
  fi
  if [ "$FENCE_POSTGRES_URL" = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable" ] \
     && command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    log "PostgreSQL: not answering, starting the local cluster"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start >/dev/null 2>&1 || true
    for _ in $(seq 1 100); do
      if psql "$FENCE_POSTGRES_URL" -qAtc 'select 1' >/dev/null 2>&1; then log "PostgreSQL: started"; return 0; fi
      # The database may be missing on a fresh cluster.
      if psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" -qAtc 'select 1' >/dev/null 2>&1; then
        psql "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable" -qc 'create database test' >/dev/null 2>&1 || true
      fi
      sleep 0.1
    done
  fi
  log "PostgreSQL: nothing answers at $FENCE_POSTGRES_URL; start PostgreSQL or set FENCE_POSTGRES_URL"
  return 1
}
