#!/usr/bin/env bash
# Soak run of the paused-holder trials (integration/reliability): real lease
# holder processes frozen with SIGSTOP around the TTL while others take over,
# writing to PostgreSQL and S3 through the guards; the stores' records are
# checked after every trial. Prints the counts.
#
#   ./scripts/soak.sh                  # 1,000 trials, a random seed (printed)
#   TRIALS=5000 ./scripts/soak.sh
#   SEED=12345 ./scripts/soak.sh       # replay a run
#   PARALLEL=6 TTL_MS=200 ./scripts/soak.sh
#
# Like scripts/test.sh it starts what it can (Redis, PostgreSQL, versitygw).
# The figures (JSON lines) go to ${FIGURES:-/tmp/fencekit-soak-figures.jsonl}.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

ensure_redis
ensure_postgres
trap stop_s3 EXIT
ensure_s3

: "${TRIALS:=1000}"
: "${SEED:=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
: "${PARALLEL:=6}"
: "${TTL_MS:=200}"
: "${FIGURES:=/tmp/fencekit-soak-figures.jsonl}"
echo "soak: $TRIALS trials, seed $SEED (replay: SEED=$SEED $0), $PARALLEL at once, TTL ${TTL_MS}ms; figures in $FIGURES"
start=$(date +%s)
cd integration
set +e
RELIABILITY_TRIALS="$TRIALS" RELIABILITY_SEED="$SEED" RELIABILITY_PARALLEL="$PARALLEL" \
RELIABILITY_TTL_MS="$TTL_MS" RELIABILITY_FIGURES="$FIGURES" \
  go test -count=1 -timeout 60m -run '^TestPausedHoldersRandomized$' -v ./reliability/ \
  | grep -E '^(---|ok|FAIL|PASS)|paused-holder trials|seed|trial [0-9]+'
status=${PIPESTATUS[0]}
set -e
echo "soak: $(( $(date +%s) - start ))s"
exit "$status"
