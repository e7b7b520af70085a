#!/usr/bin/env bash
# A schema registry for spate's Avro/Protobuf tests (issue 21; README
# "Schema registry"). Same shape as ci/kafka.sh.
#
# THIS IS A TEST FIXTURE, NOT A REAL REGISTRY: ci/registry_fixture.py
# (Python stdlib, in memory) serves the Confluent REST subset spate and the
# tests use. No real registry runs here: Apicurio Registry's Maven artifact
# (io.apicurio:apicurio-registry-app) is a library jar, and building it into
# a Quarkus application needs modules of its own (and a Quarkus release) the
# reachable Maven registry does not serve; Karapace is not on PyPI here. The
# fixture's header lists what failed. A real registry answers the same
# requests; point SPATE_REGISTRY_URL at one to run the tests against it.
#
#   ci/registry.sh start     start the fixture on 127.0.0.1:$SPATE_REGISTRY_PORT
#                            (default 38081), wait until it answers
#                            GET /subjects, print its URL
#   ci/registry.sh url       print the URL again
#   ci/registry.sh fail [S]  make every registry request answer HTTP S
#                            (default 503) until `recover` (outage tests)
#   ci/registry.sh recover   answer normally again
#   ci/registry.sh stop      stop it (a registry that is down altogether),
#                            remove state
#
# State (pid, log) under $SPATE_REGISTRY_DIR (default /tmp/spate-registry).
# $SPATE_REGISTRY_AUTH=USER:PASSWORD turns HTTP Basic auth on.
# Never a silent skip: a fixture that exits or does not answer within
# $SPATE_REGISTRY_WAIT_SECS (default 20) fails `start` with its log.
# Measured here: start about 0.2 s, 15 MB resident.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${SPATE_REGISTRY_DIR:-/tmp/spate-registry}"
PORT="${SPATE_REGISTRY_PORT:-38081}"
WAIT_SECS="${SPATE_REGISTRY_WAIT_SECS:-20}"
AUTH="${SPATE_REGISTRY_AUTH:-}"

log() { printf 'registry.sh: %s\n' "$*" >&2; }

url() { echo "http://127.0.0.1:$PORT"; }

curl_auth() {
  if [[ -n "$AUTH" ]]; then curl -sS -u "$AUTH" "$@"; else curl -sS "$@"; fi
}

running() { [[ -f "$ROOT/pid" ]] && kill -0 "$(cat "$ROOT/pid")" 2>/dev/null; }

control() {
  running || { log "no fixture running under $ROOT"; exit 1; }
  curl -sS -f -X POST "$(url)/_fixture/$1" >/dev/null || { log "control $1 failed"; exit 1; }
}

case "${1:-}" in
  start)
    command -v python3 >/dev/null || { log "python3 is missing"; exit 1; }
    command -v curl >/dev/null || { log "curl is missing"; exit 1; }
    if running; then
      log "a fixture is already running under $ROOT (pid $(cat "$ROOT/pid")); run stop first"
      exit 1
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      log "port $PORT already answers, not a fixture started from $ROOT; set SPATE_REGISTRY_PORT"
      exit 1
    fi
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    args=(--port "$PORT")
    [[ -n "$AUTH" ]] && args+=(--user "$AUTH")
    nohup python3 "$HERE/registry_fixture.py" "${args[@]}" >"$ROOT/stdout.log" 2>"$ROOT/server.log" &
    echo $! >"$ROOT/pid"
    deadline=$((SECONDS + WAIT_SECS))
    until curl_auth -f -o /dev/null "$(url)/subjects" 2>/dev/null; do
      if ! running; then
        log "the fixture (pid $(cat "$ROOT/pid")) exited; its log:"
        tail -n 20 "$ROOT/server.log" >&2 || true
        exit 1
      fi
      if ((SECONDS > deadline)); then
        log "the fixture did not answer GET /subjects within ${WAIT_SECS}s; its log:"
        tail -n 20 "$ROOT/server.log" >&2 || true
        exit 1
      fi
      sleep 0.1
    done
    log "TEST FIXTURE registry (ci/registry_fixture.py, not a real registry): pid $(cat "$ROOT/pid"), $(url)"
    url
    ;;
  url) url ;;
  fail) control "fail?status=${2:-503}" ;;
  recover) control recover ;;
  stop)
    if running; then
      pid=$(cat "$ROOT/pid")
      kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      log "stopped pid $pid"
    fi
    rm -rf "$ROOT"
    ;;
  *)
    echo "usage: $0 start | url | fail [STATUS] | recover | stop" >&2
    exit 2
    ;;
esac
