#!/usr/bin/env bash
# Runs fencekit's whole benchmark comparison (docs/benchmarks.md) in one go,
# in about 26 minutes on a 2-core machine (25 min 34 s on 2026-12-07, at load
# 7.5-11.7 while other builds ran), against real services:
#
#   1. bench: BenchmarkCyclePaired, BenchmarkCycle, BenchmarkManagerOverhead
#        uncontended acquire+release: fencekit, redislock, redsync, the raw floor
#   2. bench: BenchmarkHandoff
#        release-to-next-acquire latency, 1 holder and 4 waiters per lock
#   3. bench/cmd/renewscale
#        one process renewing 1, 100, 10000 leases (TTL 10 s): Redis commands/s,
#        round trips per tick, process CPU, batching on and off
#   4. sqlguard, blobguard package benchmarks, and bench: BenchmarkGuardPaired
#        fenced vs plain PostgreSQL UPDATE and transaction, S3 PutObject 4 KiB/1 MiB
#   5. bench: BenchmarkPGCycle, BenchmarkPGHandoff
#        leases in PostgreSQL: pglease (table and session mode) vs the
#        minimal SQL floor, its own statements sent directly and
#        cirello.io/pglock, also after churn; hand-off with LISTEN/NOTIFY vs
#        pglock's polling (the throughput and renew load benchmarks of
#        every store are run apart: docs/benchmarks.md)
#   6. bench: BenchmarkRiverPaired
#        a River job fenced by riverfence vs the same job in plain River,
#        in alternating batches, with synchronous commits and without
#
#   ./scripts/bench.sh [OUTDIR]     # default OUTDIR: bench/results/<UTC time>
#
# 1, 2 and 4 run as compiled test binaries with -count 1, BENCH_COUNT rounds
# (default 6), so that every implementation is measured in every round,
# interleaved, and the drifts of a shared machine hit all of them alike.
# renewscale interleaves its own configurations, BENCH_RENEW_COUNT rounds
# (default 3: its counters are exact; only its CPU times vary).
#
# Services: Redis and PostgreSQL are checked (and started where possible) by
# scripts/services.sh. BenchmarkCyclePaired and BenchmarkHandoff use the shared
# Redis at FENCE_REDIS_URL; BenchmarkCycle runs on a private redis-server that
# this script starts, so that the server's INFO counters see it alone (and
# BENCH_PRIVATE_REDIS=1 moves the others there too). renewscale starts its own.
# A versitygw S3 server is started on tmpfs for blobguard. Everything started
# is stopped on exit.
#
# Output: raw go-test outputs in OUTDIR/*.txt, the machine in OUTDIR/machine.txt,
# the benchstat tables printed and saved to OUTDIR/summary.txt.
# Knobs: BENCH_COUNT, BENCH_RENEW_COUNT, BENCH_HANDOFFS (hand-offs per run,
# default 300), BENCH_PG_CYCLES (cycles per PostgreSQL cycle run, default 400),
# BENCH_PG_HANDOFFS (default 160), BENCH_RIVER_JOBS (jobs per side and
# commit mode per round, default 2000), BENCH_PRIVATE_REDIS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

count="${BENCH_COUNT:-6}"
renew_count="${BENCH_RENEW_COUNT:-3}"
handoffs="${BENCH_HANDOFFS:-300}"
pg_cycles="${BENCH_PG_CYCLES:-400}"
pg_handoffs="${BENCH_PG_HANDOFFS:-160}"
river_jobs="${BENCH_RIVER_JOBS:-2000}"
benchstat_version="v0.0.0-20260908200009-22c9c6c9d4da"
out="${1:-bench/results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
bin="$(mktemp -d "${TMPDIR:-/tmp}/fencekit-bench-bin.XXXXXX")"
benchstat_dir="$(fence_cache_dir)/benchstat-$benchstat_version"
started=$SECONDS

private_redis_pid=""
private_redis_dir=""
private_redis_url=""
cleanup() {
  stop_s3
  stop_dynamodb
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
ensure_redis
ensure_postgres
# A private redis-server, serving one benchmark alone so that its INFO
# counters measure that benchmark (BenchmarkCycle's redis-cmds/op and
# redis-script-ns/op), and, with BENCH_PRIVATE_REDIS=1, all of them.
port="$(free_port)"
private_redis_dir="$(mktemp -d "${TMPDIR:-/tmp}/fencekit-bench-redis.XXXXXX")"
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$private_redis_dir" --logfile "$private_redis_dir/redis.log" >/dev/null &
private_redis_pid=$!
private_redis_url="redis://127.0.0.1:$port/0"
for _ in $(seq 1 50); do
  [ "$(redis-cli -u "$private_redis_url" ping 2>/dev/null)" = PONG ] && break
  sleep 0.1
done
[ "$(redis-cli -u "$private_redis_url" ping 2>/dev/null)" = PONG ] || { log "private redis-server did not start"; exit 1; }
if [ "${BENCH_PRIVATE_REDIS:-0}" = 1 ]; then
  export FENCE_REDIS_URL="$private_redis_url"
fi
# versitygw keeps its data under TMPDIR: tmpfs keeps disk writeback out of
# the S3 numbers (see blobguard/bench_test.go).
if [ -d /dev/shm ] && [ -w /dev/shm ]; then
  TMPDIR=/dev/shm ensure_s3
else
  ensure_s3
fi

ensure_dynamodb

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
  echo "dynamodb: $FENCE_DYNAMODB_ENDPOINT (DynamoDB Local $FENCE_DYNAMODB_LOCAL_VERSION unless the variable was set)"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/machine.txt"
cat "$out/machine.txt" >&2

for round in $(seq 1 "$count"); do
  step "round $round/$count: cycle, hand-off"
  # The bench tests read fencekit's Lua scripts from ../lease/redislease.
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkCyclePaired$' -test.count 1) >>"$out/cycle-paired.txt"
  (cd bench && FENCE_REDIS_URL="$private_redis_url" FENCE_BENCH_OWN_REDIS=1 \
    "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkCycle$' -test.benchmem -test.count 1) >>"$out/cycle.txt"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkHandoff$' -test.benchtime "${handoffs}x" -test.count 1) >>"$out/handoff.txt"
  step "round $round/$count: sqlguard, blobguard"
  (cd sqlguard && "$bin/sqlguard.test" -test.run '^$' -test.bench . -test.count 1) >>"$out/sqlguard.txt"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkGuardPaired$' -test.benchtime 500ms -test.count 1) >>"$out/guard-paired.txt"
  (cd blobguard && "$bin/blobguard.test" -test.run '^$' -test.bench . -test.count 1) >>"$out/blobguard.txt"
  step "round $round/$count: PostgreSQL leases"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkPGCycle$' -test.benchtime "${pg_cycles}x" -test.count 1) >>"$out/pg-cycle.txt"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkPGHandoff$' -test.benchtime "${pg_handoffs}x" -test.count 1) >>"$out/pg-handoff.txt"
  step "round $round/$count: River jobs"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkRiverPaired$' -test.benchtime "${river_jobs}x" -test.count 1) >>"$out/river.txt"
  step "round $round/$count: DynamoDB"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkDynamo(CyclePaired|GuardPaired)$' -test.benchtime 300x -test.count 1) >>"$out/dynamo.txt"
  (cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkDynamoHandoff$' -test.benchtime 120x -test.count 1) >>"$out/dynamo-handoff.txt"
done
(cd bench && "$bin/bench.test" -test.run '^$' -test.bench '^BenchmarkManagerOverhead$' -test.count "$count") >>"$out/overhead.txt"

step "renewal at scale ($renew_count rounds; its own redis-server)"
"$bin/renewscale" -count "$renew_count" -acquire burst -leases 1,100,10000 -batching on,off >>"$out/renew.txt"
"$bin/renewscale" -count "$renew_count" -acquire spread -leases 10000 -batching on,off,100ms >>"$out/renew.txt"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/machine.txt"

step "benchstat"
bs() { "$benchstat_dir/benchstat" "$@"; echo; }
{
  cat "$out/machine.txt"
  echo
  echo "## 1a. Uncontended acquire+release, each cycle paired with a raw one (raw-ratio: lib / interleaved raw)"
  bs -col /lib "$out/cycle-paired.txt"
  echo "## 1b. Uncontended acquire+release on a private redis-server (allocations, client CPU, server work)"
  bs -col /lib "$out/cycle.txt"
  echo "## 1c. fencekit's Go-side cost per cycle, over a backend without I/O"
  bs "$out/overhead.txt"
  echo "## 2. Hand-off latency under contention (1 holder, 4 waiters; vs lib=fencekit)"
  bs -col /lib "$out/handoff.txt"
  echo "## 3. Renewal at scale (TTL 10 s; batching=on is the default, vs batching=off)"
  bs -col /batching -row /acquire,/leases "$out/renew.txt"
  echo "## 4a. sqlguard: fenced vs plain PostgreSQL (the package's benchmarks)"
  bs -col /kind "$out/sqlguard.txt"
  echo "## 4b. sqlguard: each fenced write paired with a plain one (plain-ratio: fenced / interleaved plain)"
  bs "$out/guard-paired.txt"
  echo "## 4c. blobguard: fenced vs plain S3 PutObject"
  bs -col /mode "$out/blobguard.txt"
  echo "## 5a. Leases in PostgreSQL: uncontended acquire+release (pglease vs the floor, its raw statements and pglock; pair=* rows: ratios)"
  bs -col /lib "$out/pg-cycle.txt"
  echo "## 5b. Leases in PostgreSQL: hand-off latency (LISTEN/NOTIFY vs pglock's polling)"
  bs -col /lib "$out/pg-handoff.txt"
  echo "## 6. River jobs: fenced (riverfence) vs plain River, alternating batches (plain-ratio: fenced time / plain time)"
  bs "$out/river.txt"
  echo "## 8a. DynamoDB: dynamolease's cycle paired with its raw requests; dynamoguard's Put paired with a plain PutItem"
  bs -col /lib "$out/dynamo.txt"
  echo "## 8b. DynamoDB: hand-off latency (polling waiters)"
  bs -col /lib "$out/dynamo-handoff.txt"
} | tee "$out/summary.txt"
step "done: raw outputs and summary in $out"
