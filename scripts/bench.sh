#!/usr/bin/env bash
# Runs fencekit's whole benchmark comparison (docs/benchmarks.md) in one go,
# in well under ten minutes on a 2-core machine, against real services:
#
#   1. BenchmarkCycle    acquire+release: fencekit, redislock, redsync, raw floor
#   2. BenchmarkHandoff  release-to-next-acquire latency under contention
#   3. renewscale        renewing 1, 100, 10000 leases: Redis commands/s, CPU,
#                        round trips per tick, batching on and off (own redis-server)
#   4. sqlguard, blobguard  fenced vs plain PostgreSQL UPDATE/transaction and S3 put
#
#   ./scripts/bench.sh [OUTDIR]     # default OUTDIR: bench/results/<UTC time>
#
# Benchmarks 1, 2 and 4 run as compiled test binaries, -count 1 each, BENCH_COUNT
# times in a row (default 6), so that every implementation is measured in every
# round, interleaved, and slow drifts of a shared machine hit all of them alike.
# renewscale interleaves its own configurations, BENCH_RENEW_COUNT rounds
# (default 3: its counters are exact, only its CPU times vary).
#
# It checks (and starts where it can) Redis and PostgreSQL through
# scripts/services.sh, starts a versitygw S3 server on tmpfs for blobguard and a
# private redis-server for renewscale, and stops what it started. Raw outputs go
# to OUTDIR/*.txt; the benchstat tables are printed and saved to OUTDIR/summary.txt.
#
# Environment: FENCE_REDIS_URL and FENCE_POSTGRES_URL as for the tests;
# BENCH_COUNT, BENCH_RENEW_COUNT; BENCH_HANDOFFS (hand-offs per run, default 300);
# BENCH_PRIVATE_REDIS=1 runs benchmarks 1 and 2 on a private redis-server
# instead of the shared FENCE_REDIS_URL (less noise from other clients).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
. scripts/services.sh

count="${BENCH_COUNT:-6}"
renew_count="${BENCH_RENEW_COUNT:-3}"
handoffs="${BENCH_HANDOFFS:-300}"
benchstat_version="v0.0.0-20260908200009-22c9c6c9d4da"
out="${1:-bench/results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$(mktemp -d "${TMPDIR:-/tmp}/fencekit-bench-bin.XXXXXX")"
benchstat_dir="$(fence_cache_dir)/benchstat-$benchstat_version"
started=$SECONDS

private_redis_pid=""
private_redis_dir=""
cleanup() {
  stop_s3
  if [ -n "$private_redis_pid" ]; then
    kill "$private_redis_pid" 2>/dev/null || true
    wait "$private_redis_pid" 2>/dev/null || true
  fi
  [ -z "$private_redis_dir" ] || rm -rf "$private_redis_dir"
  rm -rf "$bin"
}
trap cleanup EXIT

step() { printf '\n[bench %4ds] %s\n' "$((SECONDS - started))" "$*" >&2; }

step "services"
if [ "${BENCH_PRIVATE_REDIS:-0}" = 1 ]; then
  port="$(free_port)"
  private_redis_dir="$(mktemp -d "${TMPDIR:-/tmp}/fencekit-bench-redis.XXXXXX")"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$private_redis_dir" --logfile "$private_redis_dir/redis.log" >/dev/null &
  private_redis_pid=$!
  export FENCE_REDIS_URL="redis://127.0.0.1:$port/0"
  for _ in $(seq 1 50); do
    [ "$(redis-cli -u "$FENCE_REDIS_URL" ping 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
fi
ensure_redis
ensure_postgres
# versitygw keeps its data under TMPDIR: tmpfs keeps disk writeback out of
# the S3 numbers (see blobguard/bench_test.go).
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  TMPDIR=/dev/shm ensure_s3
else
  ensure_s3
fi

step "build"
go test -c -o "$bin/bench.test" ./bench
go test -c -o "$bin/sqlguard.test" ./sqlguard
go test -c -o "$bin/blobguard.test" ./blobguard
go build -o "$bin/renewscale" ./bench/cmd/renewscale
if ! [ -x "$benchstat_dir/benchstat" ]; then
  # Outside the workspace, so that no go.mod or go.work of ours plays a part.
  (cd / && GOWORK=off GOBIN="$benchstat_dir" go install "golang.org/x/perf/cmd/benchstat@$benchstat_version")
fi

# The machine, for the record.
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "cores: $(nproc)"
  echo "go: $(go version)"
  echo "redis: $(redis-cli -u "$FENCE_REDIS_URL" info server | tr -d '\r' | grep '^redis_version:' | cut -d: -f2) at $FENCE_REDIS_URL"
  echo "postgres: $(psql "$FENCE_POSTGRES_URL" -qAtc 'show server_version')"
  echo "s3: versitygw $FENCE_VERSITYGW_VERSION at $FENCE_S3_ENDPOINT"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/machine.txt"
cat "$out/machine.txt" >&2

for round in $(seq 1 "$count"); do
  step "round $round/$count: cycle, hand-off"
  # The bench tests read fencekit's Lua scripts from ../lease/redislease.
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkCycle$' -test.benchmem -test.count 1) >>"$out/cycle.txt"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkHandoff$' -test.benchtime "${handoffs}x" -test.count 1) >>"$out/handoff.txt"
  step "round $round/$count: sqlguard, blobguard"
  (cd sqlguard && "$bin/sqlguard.test" -test.run '^$' -test.bench . -test.count 1) >>"$out/sqlguard.txt"
  (cd blobguard && "$bin/blobguard.test" -test.run '^$' -test.bench . -test.count 1) >>"$out/blobguard.txt"
done

step "renewal at scale ($renew_count rounds; a private redis-server)"
"$bin/renewscale" -count "$renew_count" -acquire burst >>"$out/renew.txt"
"$bin/renewscale" -count "$renew_count" -acquire spread -leases 10000 >>"$out/renew.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/machine.txt"

step "benchstat"
bs() { "$benchstat_dir/benchstat" "$@"; echo; }
{
  cat "$out/machine.txt"
  echo
  echo "## 1. Uncontended acquire+release cycle (vs lib=raw, the two-round-trip floor)"
  bs -col /lib "$out/cycle.txt"
  echo "## 2. Hand-off latency under contention (1 holder, 4 waiters; vs lib=fencekit)"
  bs -col /lib "$out/handoff.txt"
  echo "## 3. Renewal at scale (TTL 10 s; batching=on is the default, vs batching=off)"
  bs -col /batching -row /acquire,/leases "$out/renew.txt"
  echo "## 4a. sqlguard: fenced vs plain PostgreSQL"
  bs -col /kind "$out/sqlguard.txt"
  echo "## 4b. blobguard: fenced vs plain S3 PutObject"
  bs -col /mode "$out/blobguard.txt"
} | tee "$out/summary.txt"
step "done: raw outputs and summary in $out"
