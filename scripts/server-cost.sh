#!/usr/bin/env bash
# Counts the Redis server's instructions per uncontended acquire+release
# cycle of each library in bench's BenchmarkCycle (docs/benchmarks.md, "Redis"):
# for each library, a fresh redis-server runs under valgrind's callgrind
# twice, once for N and once for 3N cycles, and the difference divided by
# 2N is the server's cost of one cycle, start-up and connection set-up
# cancelled out. Instruction counts repeat from run to run whatever else
# the machine is doing, where times on a shared 2-core machine do not.
#
#   ./scripts/server-cost.sh                    # raw redislock fencekit-backend fencekit, N=2000
#   ./scripts/server-cost.sh 5000 raw fencekit  # N and the libraries
#
# Needs valgrind and redis-server (Debian: apt-get install valgrind
# redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh
n="${1:-2000}"
shift || true
libs=("$@")
[ ${#libs[@]} -gt 0 ] || libs=(raw redislock fencekit-backend fencekit)
for tool in valgrind callgrind_annotate redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "server-cost: $tool not found (apt-get install valgrind redis-server)" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/fencekit-server-cost.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd bench && go test -c -o "$work/bench.test" .)

# instructions LIB CYCLES: the server's total instructions for a run of
# CYCLES cycles of LIB.
instructions() {
  local lib=$1 cycles=$2 port dir
  port=$(free_port)
  dir=$(mktemp -d "$work/run.XXXXXX")
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/valgrind.log" 2>&1 &
  local vg=$!
  for _ in $(seq 1 150); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
  (cd bench && FENCE_REDIS_URL="redis://127.0.0.1:$port/0" "$work/bench.test" -test.run '^$' \
    -test.bench "^BenchmarkCycle\$/^lib=$lib\$" -test.benchtime "${cycles}x" >"$dir/bench.log" 2>&1) ||
    { cat "$dir/bench.log" >&2; redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; exit 1; }
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$vg" || true
  awk '/^(summary|totals):/ {print $2; exit}' "$dir/cg.out"
}

printf '%-18s %12s\n' lib 'instr/cycle'
for lib in "${libs[@]}"; do
  a=$(instructions "$lib" "$n")
  b=$(instructions "$lib" $((3 * n)))
  printf '%-18s %12d\n' "$lib" $(((b - a) / (2 * n)))
done
