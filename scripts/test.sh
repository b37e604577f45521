#!/usr/bin/env bash
# Runs the whole fencekit test suite, with the race detector, against real
# services. It checks (and starts where it can) Redis, PostgreSQL, MariaDB,
# DynamoDB Local and the S3-compatible server, installs ZooKeeper (its tests
# start their own servers) and PgBouncer (the pooler tests start their own)
# where they are missing, and fails loudly if one cannot be had.
#
#   ./scripts/test.sh                     # every stage: nothing skipped
#   FENCE_STAGES=quick ./scripts/test.sh  # one stage (or a list: checks,quick)
#   ./scripts/test.sh ./lease/...         # just some packages
#
# The stages (docs/testing.md says what each costs):
#   checks  the docs, the module rule, the release as a user installs it,
#           staticcheck
#   quick   go test -race over every module (go vet's analyzers run inside
#           it: -vet=all), but for the slow stage's package
#   slow    the history checks and randomized fault trials
#           (integration/reliability, with -race) and the tests of
#           deadlines under load (build tag scale, alone at the end)
# FENCE_STAGES=all (the default) runs the three; the README's command and CI
# run all of them. The stages overlap where none of them measures the wall
# clock: staticcheck and the module checks beside the tests, the slow
# stage's history checks beside the quick stage; the scale tests run alone
# once everything else is done. A table of what each stage cost (wall
# time, CPU time, load) ends the output.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

# -trimpath keeps a package's directory out of the build cache's keys:
# without it every package of a fresh clone or worktree, and every module
# the release check fetches into a module cache of its own, is compiled
# and vetted again under its new path. With it a clone reuses what any
# other compiled, and staticcheck, the release check and the consumer
# share one compilation of each dependency. Programs the tests build
# (holders, the etcd server) inherit it.
case " ${GOFLAGS:-} " in
*" -trimpath "*) ;;
*) export GOFLAGS="${GOFLAGS:+$GOFLAGS }-trimpath" ;;
esac

stages=${FENCE_STAGES:-all}
[ "$stages" != all ] || stages=checks,quick,slow
for s in ${stages//,/ }; do
  case $s in
  checks | quick | slow) ;;
  *) log "FENCE_STAGES: unknown stage '$s' (checks, quick, slow, a comma-separated list of them, or all)"; exit 2 ;;
  esac
done
want() { [[ ",$stages," == *",$1,"* ]]; }

work=$(mktemp -d "${TMPDIR:-/tmp}/fencekit-test.XXXXXX")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do
    pkill -P "$p" 2>/dev/null || true
    kill "$p" 2>/dev/null || true
  done
  stop_s3
  stop_dynamodb
  rm -rf "$work"
}
trap cleanup EXIT

# timed NAME CMD...: runs CMD and appends NAME's wall time, CPU time (CMD
# and the processes it waited for) and the load average before and after
# to the cost table.
timed() {
  local name=$1 l0 rc=0 real user sys TIMEFORMAT='%R %U %S'
  shift
  l0=$(cut -d' ' -f1 /proc/loadavg)
  { time "$@" 2>&3; } 3>&2 2>"$work/$name.time" || rc=$?
  read -r real user sys <"$work/$name.time" || true
  printf '%-34s %7.0f s %7.0f s   %5s -> %-5s %s\n' "$name" "${real:-0}" "$(awk "BEGIN { print ${user:-0} + ${sys:-0} }")" \
    "$l0" "$(cut -d' ' -f1 /proc/loadavg)" "$([ "$rc" -eq 0 ] && echo ok || echo "FAILED ($rc)")" >>"$work/costs"
  return "$rc"
}

# background NAME CMD...: runs CMD timed, its output kept for later (see
# finish).
background() {
  local name=$1
  timed "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  eval "pid_${name//[^a-z]/_}=$!"
}

# finish NAME: waits for a background stage and prints its output.
finish() {
  local name=$1 var rc=0
  var="pid_${name//[^a-z]/_}"
  echo "+ wait for $name"
  wait "${!var}" || rc=$?
  cat "$work/$name.log"
  [ "$rc" -eq 0 ] || log "$name failed (exit $rc, output above)"
  return "$rc"
}

started=$SECONDS
failed=0

# The docs against the repository: CONTRIBUTING's module list against
# go.work, every link between pages, no citation of a design document the
# repository does not hold or of an issue number (scripts/docscheck.go; a
# second, no services).
if want checks; then
  echo "+ go run scripts/docscheck.go"
  timed "checks: docscheck" go run scripts/docscheck.go
fi

pkgs=("$@")
# Every module of the workspace (go.work): the core (fence, lease, the
# conformance suites; standard library only), a module per store client
# (the Redis, PostgreSQL, etcd and ZooKeeper backends, the guards, the
# migrations and their command, the Prometheus observer), the test
# harnesses, the examples, the integration tests and the benchmark module
# (compiled and vetted; benchmarks do not run). A pattern does not cross a
# module's boundary, so each module is named.
[ $# -gt 0 ] || mapfile -t pkgs < <(go list -m -f '{{.Dir}}/...' | sed "s|^$PWD|.|")

# Static analysis: staticcheck, built once from the Go module proxy into
# the same cache as versitygw (beside the rest, on a first run); it keeps
# its own cache of results. It reads the packages as the tests compile
# them, for the race detector (GOFLAGS -race: our code has no file that
# the race build tag selects or drops), so the export data it needs is
# the compilation the tests use, made once (below). It runs beside the
# tests: it needs no service, and it does not measure time.
if want checks; then
  staticcheck_version=v0.8.2
  staticcheck="$(fence_cache_dir)/bin/staticcheck-$staticcheck_version"
  build_staticcheck() {
    local gobin
    gobin=$(mktemp -d)
    env GOBIN="$gobin" go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
    mkdir -p "$(dirname "$staticcheck")"
    mv "$gobin/staticcheck" "$staticcheck"
    rmdir "$gobin"
  }
  if [ ! -x "$staticcheck" ]; then
    echo "+ go install honnef.co/go/tools/cmd/staticcheck@$staticcheck_version &"
    background "checks: build staticcheck" build_staticcheck
  fi
fi

# The packages of each test stage. The slow stage's history checks are the
# package integration/reliability; everything else is the quick stage's.
# The packages that take longest (1-4 min each, mostly waiting on servers,
# TTLs and pauses) come first: go test starts packages in the order it is
# given them, and one of these started last would run alone at the end
# while the short ones are done.
#
# Two programs are vetted instead of tested: the etcd member and server
# (lease/etcdlease/etcdtest/etcdmember, internal/rig/cmd/etcdserver). They
# have no tests, and the tests run them built without the race detector;
# go test would compile etcd's server for the race detector only to find
# no test in them.
slow_pkg=github.com/fencekit/fencekit/integration/reliability
norace=(
  github.com/fencekit/fencekit/lease/etcdlease/etcdtest/etcdmember
  github.com/fencekit/fencekit/internal/rig/cmd/etcdserver
)
quick_pkgs=()
slow_pkgs=()
vet_pkgs=()
if [ $# -gt 0 ]; then
  if want quick || want slow; then quick_pkgs=("${pkgs[@]}"); fi
elif want quick || want slow; then
  mapfile -t all < <(go list -e "${pkgs[@]}")
  long=(
    github.com/fencekit/fencekit/lease/etcdlease
    github.com/fencekit/fencekit/integration/consensus
    github.com/fencekit/fencekit/integration
    github.com/fencekit/fencekit/lease/zklease
    github.com/fencekit/fencekit/lease/pglease
    github.com/fencekit/fencekit/lease/redislease
    github.com/fencekit/fencekit/integration/redisfailover
    github.com/fencekit/fencekit/sqlguard
  )
  for p in "${long[@]}"; do
    [[ " ${all[*]} " != *" $p "* ]] || quick_pkgs+=("$p")
  done
  for p in "${all[@]}"; do
    if [ "$p" = "$slow_pkg" ]; then
      slow_pkgs+=("$p")
    elif [[ " ${norace[*]} " == *" $p "* ]]; then
      want quick && vet_pkgs+=("$p")
    elif [[ " ${long[*]} " != *" $p "* ]]; then
      quick_pkgs+=("$p")
    fi
  done
  want quick || quick_pkgs=()
  want slow || slow_pkgs=()
fi

# Compile once. Every package the test stages and staticcheck read,
# their tests and their dependencies, compiled for the race detector by
# one go command (go list -export) before any of them starts: two go
# commands that need one package at the same time each compile it, so on
# a first run the quick stage, the slow stage and staticcheck, started
# together, compiled most of the world three times over. Beside it, a
# second go command compiles, without the race detector, the programs the
# tests build with go build (the examples, the holders, the etcd member
# and server) and what they import, which the release check and the
# consumer then find compiled too; and vets the programs vetted instead
# of tested. Neither links anything. On a warm run both find everything
# in the build cache.
test_pkgs=("${quick_pkgs[@]}" "${slow_pkgs[@]}")
if [ ${#test_pkgs[@]} -gt 0 ]; then
  echo "+ go list -race -deps -test -export ... >/dev/null &   (compiles what the tests need, once)"
  background "build: compile for -race" go list -race -e -deps -test -export -f '{{with .Error}}{{.}}{{end}}' "${test_pkgs[@]}"
  mapfile -t programs < <(go list -e -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' "${test_pkgs[@]}" "${vet_pkgs[@]}" | grep . || true)
  build_programs() {
    if [ ${#programs[@]} -gt 0 ]; then
      go list -e -deps -export -f '{{with .Error}}{{.}}{{end}}' "${programs[@]}" || return 1
    fi
    if [ ${#vet_pkgs[@]} -gt 0 ]; then go vet "${vet_pkgs[@]}"; fi
  }
  echo "+ go list -deps -export ${programs[*]} >/dev/null && go vet ${vet_pkgs[*]} &"
  background "build: programs (no -race)" build_programs
fi

if want quick || want slow; then
  ensure_redis
  ensure_postgres
  ensure_zookeeper
  ensure_pgbouncer
  ensure_mariadb

  # DynamoDB Local (dynamoguard, lease/dynamolease) and versitygw (S3) die
  # with this script, even if it is killed before the trap runs. A first
  # run builds versitygw while the tests' packages compile and DynamoDB
  # Local's Java starts.
  FENCE_DYNAMODB_DIE_WITH_SHELL=1
  FENCE_S3_DIE_WITH_SHELL=1
  build_pid=""
  if [ -z "${FENCE_S3_ENDPOINT:-}" ]; then
    install_versitygw >/dev/null &
    build_pid=$!
    pids+=("$build_pid")
  fi
  ensure_dynamodb
fi

if [ -n "${build_pid:-}" ]; then
  wait "$build_pid" || { log "S3: building versitygw failed (see above)"; exit 1; }
  build_pid=""
fi
if want quick || want slow; then
  ensure_s3
fi
if [ ${#test_pkgs[@]} -gt 0 ]; then
  finish "build: compile for -race" || failed=1
  finish "build: programs (no -race)" || failed=1
fi

# The module rule: a program that imports one library module inherits no
# other store's client (scripts/modrule.sh). And the release as a user
# meets it: the committed checkout published in a throwaway clone with the
# release's tags, installed from outside the repository by the README's
# install lines (scripts/consumer.sh). Both wait on go mod tidy, git and
# the module cache more than on the CPU: they run beside the rest, from
# the moment the programs are compiled (they compile the same packages,
# without the race detector).
if want checks && [ $# -eq 0 ]; then
  echo "+ ./scripts/modrule.sh && ./scripts/consumer.sh &   (their output follows the tests')"
  background "checks: modrule, consumer" bash -c './scripts/modrule.sh && ./scripts/consumer.sh'
fi

if want checks; then
  if [ -n "${pid_checks__build_staticcheck:-}" ]; then
    finish "checks: build staticcheck" || { log "staticcheck could not be built (above)"; exit 1; }
  fi
  # The etcd programs are read as they are built, without the race
  # detector: read with it, their dependencies (etcd's server) would be
  # compiled for it only for staticcheck.
  sc_race=("${pkgs[@]}")
  sc_plain=()
  if [ $# -eq 0 ]; then
    mapfile -t sc_race < <(go list -e "${pkgs[@]}")
    for p in "${norace[@]}"; do
      if [[ " ${sc_race[*]} " == *" $p "* ]]; then
        sc_plain+=("$p")
        mapfile -t sc_race < <(printf '%s\n' "${sc_race[@]}" | grep -vxF "$p")
      fi
    done
  fi
  run_staticcheck() {
    local rc=0
    env GOFLAGS="$GOFLAGS -race" "$staticcheck" "${sc_race[@]}" || rc=1
    if [ ${#sc_plain[@]} -gt 0 ]; then "$staticcheck" "${sc_plain[@]}" || rc=1; fi
    return $rc
  }
  echo "+ GOFLAGS=\"\$GOFLAGS -race\" staticcheck ${pkgs[*]} &   (but ${sc_plain[*]:-none}: without -race; its output follows the tests')"
  background "checks: staticcheck" run_staticcheck
  # Without the tests, go vet runs on its own (with them, go test runs
  # every vet analyzer: -vet=all), for the race detector like staticcheck.
  if ! want quick && ! want slow; then
    run_vet() {
      go vet -race "${sc_race[@]}" || return 1
      if [ ${#sc_plain[@]} -gt 0 ]; then go vet "${sc_plain[@]}"; fi
    }
    echo "+ go vet -race ${pkgs[*]}   (but ${sc_plain[*]:-none}: without -race)"
    timed "checks: go vet" run_vet || failed=1
  fi
fi

# FENCE_TEST_PARALLEL=N runs N test binaries of the quick stage at once
# (go test -p N). Unset: one more than the CPUs (Go's default is the
# number of CPUs): the long packages spend most of their time waiting on
# servers, TTLs and pauses, not computing (on 2 cores, 3 at a time took
# the whole run from 688 s to 543 s). The slow stage's history checks run
# beside them, as one more.
par=(-p "${FENCE_TEST_PARALLEL:-$(($(nproc) + 1))}")
# Go caches test results, not test binaries: every run links each
# package's race-instrumented test binary again (about 70 CPU-seconds
# warm). -w leaves out the DWARF tables, a debugger's, not the stack
# traces' or the race detector's, and takes about a quarter of that off.
link=(-ldflags=-w)

if [ ${#slow_pkgs[@]} -gt 0 ]; then
  echo "+ go test -race -vet=all -count=1 ${link[*]} ${slow_pkgs[*]} &   (its output follows the quick stage's)"
  background "slow: history checks (-race)" go test -race -vet=all -count=1 "${link[@]}" -timeout 20m "${slow_pkgs[@]}"
fi
if [ ${#quick_pkgs[@]} -gt 0 ]; then
  echo "+ go test -race -vet=all -count=1 ${link[*]} ${par[*]} ${quick_pkgs[*]}"
  timed "quick: go test -race" go test -race -vet=all -count=1 "${link[@]}" "${par[@]}" -timeout 20m "${quick_pkgs[@]}" || failed=1
fi
if [ ${#slow_pkgs[@]} -gt 0 ]; then
  finish "slow: history checks (-race)" || failed=1
fi
if want checks; then
  finish "checks: staticcheck" || failed=1
  if [ $# -eq 0 ]; then
    finish "checks: modrule, consumer" || failed=1
  fi
fi

if want slow && [ $# -eq 0 ]; then
  # Tests of deadlines under load, alone on the machine (build tag "scale"),
  # without the race detector: they time 10,000 leases against the wall
  # clock, and the detector makes each cancel several times slower than a
  # program ever runs (their code paths run under -race above, and in
  # virtual time in lease's own tests).
  echo "+ go test -count=1 -tags scale -run AtScale ./lease/... ./lease/redislease/..."
  timed "slow: scale (alone)" go test -count=1 -tags scale -run AtScale -timeout 10m ./lease/... ./lease/redislease/... || failed=1
fi

echo
echo "stage                                  wall       CPU   load before -> after"
cat "$work/costs"
printf '%-34s %7d s   (FENCE_STAGES=%s)\n' "whole run" $((SECONDS - started)) "$stages"
if [ "$failed" -ne 0 ]; then
  log "some stage failed: see above"
  exit 1
fi
