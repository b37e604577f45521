#!/usr/bin/env bash
# The module rule: a program that imports one of fencekit's library
# modules must not inherit another store's client. For each library
# module, this builds a throwaway program that imports it, runs
# `go mod tidy`, and fails if `go list -m all` names a store client other
# than the module's own; and fails if the module's own test binaries
# (go list -deps -test) link another store's client, so that a backend's
# or a guard's tests need only its own store.
#
# By default the program gets the checkout's modules through replace
# directives. With --release, it gets them as a user does, at a release's
# tags through git (scripts/consumer.sh passes the release clone, its
# version and the go command's environment for it); the test binaries are
# then not looked at again.
#
#   ./scripts/modrule.sh            # every library module
#   ./scripts/modrule.sh sqlguard   # one (its directory)
#   ./scripts/modrule.sh --release VERSION [dirs]   # in the environment consumer.sh sets
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
release=""
if [ "${1:-}" = "--release" ]; then
  release=${2:?--release needs a version}
  shift 2
fi

# module directory | the package a user imports | the store clients it may bring
rules=(
  ".|github.com/fencekit/fencekit/lease|"
  "lease/redislease|github.com/fencekit/fencekit/lease/redislease|github.com/redis/go-redis"
  "lease/pglease|github.com/fencekit/fencekit/lease/pglease|github.com/jackc/pgx github.com/pressly/goose"
  # etcd's own client (go.etcd.io/etcd/client/v3) requires the Prometheus
  # client for its gRPC metrics: etcd's, not another store's.
  "lease/etcdlease|github.com/fencekit/fencekit/lease/etcdlease|go.etcd.io/etcd github.com/prometheus/client_golang"
  "lease/zklease|github.com/fencekit/fencekit/lease/zklease|github.com/go-zookeeper/zk"
  "lease/leaseprom|github.com/fencekit/fencekit/lease/leaseprom|github.com/prometheus/client_golang"
  "lease/leaseotel|github.com/fencekit/fencekit/lease/leaseotel|go.opentelemetry.io/otel"
  "sqlguard|github.com/fencekit/fencekit/sqlguard|github.com/jackc/pgx github.com/pressly/goose"
  "blobguard|github.com/fencekit/fencekit/blobguard|github.com/aws/aws-sdk-go-v2 github.com/aws/aws-sdk-go-v2/service/s3"
  # The AWS SDK is a module per service: S3's users must not get DynamoDB's
  # client, nor DynamoDB's S3's.
  "dynamoguard|github.com/fencekit/fencekit/dynamoguard|github.com/aws/aws-sdk-go-v2 github.com/aws/aws-sdk-go-v2/service/dynamodb"
  "lease/dynamolease|github.com/fencekit/fencekit/lease/dynamolease|github.com/aws/aws-sdk-go-v2 github.com/aws/aws-sdk-go-v2/service/dynamodb"
  # goose's own go.mod requires the MySQL and SQLite drivers (its
  # dialects' tests): they are in the module graph of goose's direct
  # users, never compiled into them. Package migrations imports neither.
  "migrations|github.com/fencekit/fencekit/migrations|github.com/jackc/pgx github.com/pressly/goose github.com/go-sql-driver/mysql modernc.org/sqlite"
  "redischeck|github.com/fencekit/fencekit/redischeck|github.com/redis/go-redis"
  # River and its pgx driver: the one module that may import River. Its
  # tests run River's migrations and fencekit's (goose), on PostgreSQL.
  "riverfence|github.com/fencekit/fencekit/riverfence|github.com/riverqueue/river github.com/jackc/pgx github.com/pressly/goose"
  "fencegrpc|github.com/fencekit/fencekit/fencegrpc|google.golang.org/grpc"
  # database/sql only: the MySQL and SQLite drivers are the user's choice.
  "dbguard|github.com/fencekit/fencekit/dbguard|"
  # The AWS guards' shared retry-attempt counting: smithy-go alone, no
  # service's client. It is internal, so no program outside the repository
  # imports it: its own module graph is read instead (and with --release,
  # through blobguard's and dynamoguard's rules, which require it).
  "internal/awsattempt|github.com/fencekit/fencekit/internal/awsattempt|"
)
clients=(github.com/redis/go-redis github.com/jackc/pgx github.com/pressly/goose go.etcd.io/etcd
  github.com/go-zookeeper/zk github.com/prometheus/client_golang github.com/aws/aws-sdk-go-v2
  github.com/aws/aws-sdk-go-v2/service/s3 github.com/aws/aws-sdk-go-v2/service/dynamodb
  github.com/go-sql-driver/mysql modernc.org/sqlite github.com/riverqueue/river)

# Every module of the checkout, for replace directives.
[ -n "$release" ] || mapfile -t mods < <(GOWORK="$root/go.work" go list -m -f '{{.Path}} {{.Dir}}')

failed=0
for rule in "${rules[@]}"; do
  IFS='|' read -r dir pkg allowed <<<"$rule"
  [ $# -eq 0 ] || [[ " $* " == *" $dir "* ]] || continue
  internal=""
  [[ "$pkg" != */internal/* ]] || internal=1
  [ -z "$internal" ] || [ -z "$release" ] || continue
  tmp=$(mktemp -d)
  {
    echo "module example.com/modrule"
    echo
    echo "go 1.26.0"
    echo
    [ -n "$release" ] || for m in "${mods[@]}"; do echo "replace ${m% *} => ${m#* }"; done
  } >"$tmp/go.mod"
  printf 'package main\n\nimport _ "%s"\n\nfunc main() {}\n' "$pkg" >"$tmp/main.go"
  if [ -n "$release" ] && ! (cd "$tmp" && GOWORK=off go get "$pkg@$release" >/dev/null 2>"$tmp/err"); then
    echo "modrule: $dir: go get $pkg@$release failed:"; cat "$tmp/err"; failed=1; rm -rf "$tmp"; continue
  fi
  if [ -n "$internal" ]; then
    # No program may import an internal package: read the module's own
    # graph (it requires no sibling, so it needs no replace directive).
    graph=$(cd "$dir" && GOWORK=off go list -m all 2>"$tmp/err") || {
      echo "modrule: $dir: go list -m all failed:"; cat "$tmp/err"; failed=1; rm -rf "$tmp"; continue; }
  elif ! (cd "$tmp" && GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=mod" go mod tidy >/dev/null 2>"$tmp/err"); then
    echo "modrule: $dir: go mod tidy failed:"; cat "$tmp/err"; failed=1; rm -rf "$tmp"; continue
  else
    graph=$(cd "$tmp" && GOWORK=off go list -m all)
  fi
  bad=()
  for c in "${clients[@]}"; do
    [[ " $allowed " == *" $c "* ]] && continue
    if grep -q "^$c" <<<"$graph"; then bad+=("$c"); fi
  done
  # The module's own tests need only its own store: no package of another
  # store's client in its test binaries (end-to-end writes through another
  # store's guard belong in integration/).
  if [ -n "$release" ]; then
    if [ ${#bad[@]} -gt 0 ]; then
      echo "modrule: FAIL $dir@$release: a program importing $pkg inherits ${bad[*]}"; failed=1
    else
      echo "modrule: ok   $dir@$release: $(grep -c . <<<"$graph") modules, no other store's client"
    fi
    rm -rf "$tmp"; continue
  fi
  deps=$(cd "$dir" && GOWORK="$root/go.work" go list -deps -test ./... 2>"$tmp/err") || {
    echo "modrule: $dir: go list -deps -test failed:"; cat "$tmp/err"; failed=1; rm -rf "$tmp"; continue; }
  testbad=()
  for c in "${clients[@]}"; do
    [[ " $allowed " == *" $c "* ]] && continue
    if grep -Eq "^$c(/|$)" <<<"$deps"; then testbad+=("$c"); fi
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "modrule: FAIL $dir: a program importing $pkg inherits ${bad[*]}"
    failed=1
  fi
  if [ ${#testbad[@]} -gt 0 ]; then
    echo "modrule: FAIL $dir: its tests link ${testbad[*]} (another store's client: move that test to integration/)"
    failed=1
  fi
  if [ ${#bad[@]} -eq 0 ] && [ ${#testbad[@]} -eq 0 ]; then
    echo "modrule: ok   $dir: $(grep -c . <<<"$graph") modules, no other store's client, nor in its tests"
  fi
  rm -rf "$tmp"
done
exit $failed
