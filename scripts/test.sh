#!/usr/bin/env bash
# Runs the whole fencekit test suite, with the race detector, against real
# services. It checks (and starts where it can) Redis, PostgreSQL and the
# S3-compatible server, installs ZooKeeper (its tests start their own
# servers) and PgBouncer (the pooler tests start their own) where they are
# missing, and fails loudly if one cannot be had.
#
#   ./scripts/test.sh            # everything
#   ./scripts/test.sh ./lease/...  # just some packages
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

# The docs against the repository: CONTRIBUTING's module list against
# go.work, every link between pages, no citation of a design document the
# repository does not hold or of an issue number (scripts/docscheck.go; a
# second, no services).
echo "+ go run scripts/docscheck.go"
go run scripts/docscheck.go

ensure_redis
ensure_postgres
ensure_zookeeper
ensure_pgbouncer
ensure_mariadb

pkgs=("$@")
# Every module of the workspace (go.work): the core (fence, lease, the
# conformance suites; standard library only), a module per store client
# (the Redis, PostgreSQL, etcd and ZooKeeper backends, the guards, the
# migrations and their command, the Prometheus observer), the test
# harnesses, the examples, the integration tests and the benchmark module
# (compiled and vetted; benchmarks do not run). A pattern does not cross a
# module's boundary, so each module is named.
if [ ${#pkgs[@]} -eq 0 ]; then
  mapfile -t pkgs < <(go list -m -f '{{.Dir}}/...' | sed "s|^$PWD|.|")
  # The modules whose packages take longest (1.5-4 min each, mostly
  # waiting on servers, TTLs and pauses) first: go test starts packages in
  # the order it is given them, and one of these started last would run
  # alone at the end while the short ones are done.
  first=()
  for p in ./integration/... ./lease/etcdlease/... ./lease/zklease/... ./lease/redislease/... ./lease/pglease/... ./sqlguard/...; do
    [[ " ${pkgs[*]} " != *" $p "* ]] || first+=("$p")
  done
  rest=()
  for p in "${pkgs[@]}"; do
    [[ " ${first[*]} " == *" $p "* ]] || rest+=("$p")
  done
  pkgs=("${first[@]}" "${rest[@]}")
fi

# The module rule: a program that imports one library module inherits no
# other store's client (scripts/modrule.sh). And the release as a user
# meets it: the committed checkout published in a throwaway clone with the
# release's tags, installed from outside the repository by the README's
# install lines (scripts/consumer.sh). Both wait on go mod tidy, git and
# the module cache more than on the CPU, so they run beside go vet and are
# waited for before the tests.
checks_pid=""
checks_log=""
if [ $# -eq 0 ]; then
  echo "+ ./scripts/modrule.sh && ./scripts/consumer.sh &   (their output follows go vet's)"
  checks_log=$(mktemp "${TMPDIR:-/tmp}/fencekit-checks.XXXXXX")
  { ./scripts/modrule.sh && ./scripts/consumer.sh; } >"$checks_log" 2>&1 &
  checks_pid=$!
fi

# A first run builds versitygw (for S3) while go vet compiles the packages:
# go vet needs no S3, and the two overlap their downloads and waits.
build_pid=""
if [ -z "${FENCE_S3_ENDPOINT:-}" ]; then
  install_versitygw >/dev/null &
  build_pid=$!
fi
trap '[ -z "$build_pid" ] || kill "$build_pid" 2>/dev/null; [ -z "$checks_pid" ] || kill "$checks_pid" 2>/dev/null; [ -z "$checks_log" ] || rm -f "$checks_log"; stop_s3; stop_dynamodb' EXIT

# DynamoDB Local (dynamoguard, lease/dynamolease) dies with this script.
# Started now, its Java start-up overlaps go vet instead of delaying the
# tests.
FENCE_DYNAMODB_DIE_WITH_SHELL=1
ensure_dynamodb

echo "+ go vet ${pkgs[*]}   (a first run downloads and compiles everything: see docs/testing.md for how long)"
go vet "${pkgs[@]}"

# Static analysis: staticcheck, built once from the Go module proxy into
# the same cache as versitygw.
staticcheck_version=v0.8.2
staticcheck="${XDG_CACHE_HOME:-$HOME/.cache}/fencekit/bin/staticcheck-$staticcheck_version"
if [ ! -x "$staticcheck" ]; then
  echo "+ go install honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
  gobin=$(mktemp -d)
  GOBIN="$gobin" go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
  mkdir -p "$(dirname "$staticcheck")"
  mv "$gobin/staticcheck" "$staticcheck"
  rmdir "$gobin"
fi
echo "+ staticcheck ${pkgs[*]}"
"$staticcheck" "${pkgs[@]}"

if [ -n "$checks_pid" ]; then
  echo "+ wait for ./scripts/modrule.sh && ./scripts/consumer.sh"
  checks_rc=0
  wait "$checks_pid" || checks_rc=$?
  checks_pid=""
  cat "$checks_log"
  [ "$checks_rc" -eq 0 ] || { log "the module rule or the consumer check failed (see above)"; exit 1; }
fi

if [ -n "$build_pid" ]; then
  wait "$build_pid" || { log "S3: building versitygw failed (see above)"; exit 1; }
  build_pid=""
fi
# versitygw dies with this script, even if it is killed before the trap runs.
FENCE_S3_DIE_WITH_SHELL=1
ensure_s3
# FENCE_TEST_PARALLEL=N runs N test binaries at once (go test -p N; unset:
# Go's default, the number of CPUs). The long packages spend about three
# quarters of their time waiting (servers starting, TTLs running out,
# paused processes), so 4 on 2 cores ran the slowest modules in 6.6 min
# instead of 11.9, but at load 12-23 four more packages failed on timing
# (a 1 s TTL expiring, a 250 ms takeover, 10,000 renewals): the default
# stays Go's.
par=()
[ -z "${FENCE_TEST_PARALLEL:-}" ] || par=(-p "$FENCE_TEST_PARALLEL")
echo "+ go test -race -count=1 ${par[*]} ${pkgs[*]}"
go test -race -count=1 "${par[@]}" -timeout 20m "${pkgs[@]}"

if [ $# -eq 0 ]; then
  # Tests of deadlines under load, alone on the machine (build tag "scale"),
  # without the race detector: they time 10,000 leases against the wall
  # clock, and the detector makes each cancel several times slower than a
  # program ever runs (their code paths run under -race above, and in
  # virtual time in lease's own tests).
  echo "+ go test -count=1 -tags scale -run AtScale ./lease/... ./lease/redislease/..."
  go test -count=1 -tags scale -run AtScale -timeout 10m ./lease/... ./lease/redislease/...
fi
