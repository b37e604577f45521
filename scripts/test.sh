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
fi

# The module rule: a program that imports one library module inherits no
# other store's client (scripts/modrule.sh).
if [ $# -eq 0 ]; then
  echo "+ ./scripts/modrule.sh"
  ./scripts/modrule.sh
fi

# A first run builds versitygw (for S3) while go vet compiles the packages:
# go vet needs no S3, and the two overlap their downloads and waits.
build_pid=""
if [ -z "${FENCE_S3_ENDPOINT:-}" ]; then
  install_versitygw >/dev/null &
  build_pid=$!
fi
trap '[ -z "$build_pid" ] || kill "$build_pid" 2>/dev/null; stop_s3; stop_dynamodb' EXIT

echo "+ go vet ${pkgs[*]}   (a first run downloads and compiles everything: see the README for how long)"
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

if [ -n "$build_pid" ]; then
  wait "$build_pid" || { log "S3: building versitygw failed (see above)"; exit 1; }
  build_pid=""
fi
# versitygw dies with this script, even if it is killed before the trap runs.
FENCE_S3_DIE_WITH_SHELL=1
ensure_s3
# DynamoDB Local (dynamoguard, lease/dynamolease) likewise dies with it.
FENCE_DYNAMODB_DIE_WITH_SHELL=1
ensure_dynamodb

echo "+ go test -race -count=1 ${pkgs[*]}"
go test -race -count=1 -timeout 20m "${pkgs[@]}"

if [ $# -eq 0 ]; then
  # Tests of deadlines under load, alone on the machine (build tag "scale").
  echo "+ go test -race -count=1 -tags scale -run AtScale ./lease/... ./lease/redislease/..."
  go test -race -count=1 -tags scale -run AtScale -timeout 10m ./lease/... ./lease/redislease/...
fi
