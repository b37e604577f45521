#!/usr/bin/env bash
# The S3-compatible server (versitygw) for demos and benchmarks, on top of
# ensure_s3 in services.sh (the test script uses ensure_s3 directly).
#
#   ./scripts/s3server.sh start        # start in the background, print its exports
#   eval "$(./scripts/s3server.sh env)" # set FENCE_S3_* in your shell
#   ./scripts/s3server.sh stop         # stop it and remove its data
#   ./scripts/s3server.sh run CMD...   # start, run CMD with FENCE_S3_* set, stop
#
# With FENCE_S3_ENDPOINT already set, nothing is started: that server is used.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/services.sh

state="$(fence_cache_dir)/s3server.env"

write_state() {
  mkdir -p "$(dirname "$state")"
  {
    for v in FENCE_S3_ENDPOINT FENCE_S3_ACCESS_KEY FENCE_S3_SECRET_KEY FENCE_S3_BUCKET FENCE_S3_PID FENCE_S3_DIR; do
      printf 'export %s=%q\n' "$v" "${!v}"
    done
  } >"$state"
}

case "${1:-}" in
start)
  if [ -f "$state" ]; then
    # shellcheck disable=SC1090
    . "$state"
    if [ -n "$FENCE_S3_PID" ] && kill -0 "$FENCE_S3_PID" 2>/dev/null && s3_answers "$FENCE_S3_ENDPOINT"; then
      log "S3: already running at $FENCE_S3_ENDPOINT (pid $FENCE_S3_PID)"
      cat "$state"
      exit 0
    fi
    rm -f "$state"
    unset FENCE_S3_ENDPOINT FENCE_S3_ACCESS_KEY FENCE_S3_SECRET_KEY FENCE_S3_BUCKET
    FENCE_S3_PID="" FENCE_S3_DIR=""
  fi
  ensure_s3
  write_state
  cat "$state"
  ;;
env)
  [ -f "$state" ] || { log "S3: not started; run $0 start"; exit 1; }
  cat "$state"
  ;;
stop)
  if [ -f "$state" ]; then
    # shellcheck disable=SC1090
    . "$state"
    stop_s3
    rm -f "$state"
    log "S3: stopped"
  fi
  ;;
run)
  shift
  [ $# -gt 0 ] || { log "usage: $0 run CMD..."; exit 2; }
  trap stop_s3 EXIT
  ensure_s3
  "$@"
  ;;
*)
  echo "usage: $0 start|env|stop|run CMD..." >&2
  exit 2
  ;;
esac
