#!/usr/bin/env bash
# Runs the whole fencekit test suite, with the race detector, against real
# services. It checks (and starts where it can) Redis, PostgreSQL and the
# S3-compatible server, and fails loudly if one is missing.
#
#   ./scripts/test.sh            # everything
#   ./scripts/test.sh ./lease/...  # just some packages
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

ensure_redis
ensure_postgres
trap stop_s3 EXIT
# versitygw dies with this script, even if it is killed before the trap runs.
FENCE_S3_DIE_WITH_SHELL=1
ensure_s3

pkgs=("$@")
# Every module of the workspace (go.work): the library, examples, integration
# tests and the benchmark module (compiled and vetted; benchmarks do not run).
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./... ./examples/... ./integration/... ./bench/...)

echo "+ go vet ${pkgs[*]}   (the first run downloads and compiles everything: a few minutes)"
go vet "${pkgs[@]}"
echo "+ go test -race -count=1 ${pkgs[*]}"
go test -race -count=1 -timeout 20m "${pkgs[@]}"
