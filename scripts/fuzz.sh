#!/usr/bin/env bash
# Fuzzes each of fencekit's native Go fuzz targets for a while, one after
# the other. Their seed corpora already run as ordinary tests in
# ./scripts/test.sh; this looks for new inputs. Targets that write to the
# stores (sqlguard, migrations) need PostgreSQL, and blobguard's test binary
# needs S3: services are started as scripts/test.sh does.
#
#   ./scripts/fuzz.sh            # 30s per target
#   ./scripts/fuzz.sh 5m         # 5 minutes per target
#   ./scripts/fuzz.sh 1m FuzzParseEnvelope FuzzKeysFor   # some targets
#
# A failing input is written under the package's testdata/fuzz/<Target>/
# (commit it: it then runs as a regression test) and the script exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

time="${1:-30s}"
shift || true

targets=(
  ./lease:FuzzValidateName
  ./lease:FuzzNewManagerOptions
  ./lease/redislease:FuzzKeysFor
  ./sqlguard:FuzzTableNamesAndKeys
  ./migrations:FuzzParseTableName
  ./migrations:FuzzLockVersionMigrationUnderGoose
  ./blobguard:FuzzParseEnvelope
  ./blobguard:FuzzValidateKey
  ./fencewire:FuzzParse
  ./fencewire:FuzzAdmit
)

ensure_redis
ensure_postgres
trap stop_s3 EXIT
ensure_s3

failed=0
for t in "${targets[@]}"; do
  pkg="${t%%:*}" name="${t##*:}"
  if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then
    continue
  fi
  echo "+ go test -run '^\$' -fuzz '^$name\$' -fuzztime $time $pkg"
  if ! go test -run '^$' -fuzz "^$name\$" -fuzztime "$time" "$pkg" 2>&1 | grep -vE '^fuzz: elapsed: .*gathering'; then
    failed=1
  fi
done
exit "$failed"
