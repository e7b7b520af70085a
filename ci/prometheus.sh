#!/usr/bin/env bash
# A real Prometheus (Debian's `prometheus` package) for the tests of
# spate's operations kit (ops/prometheus, ops/grafana; docs/OPERATIONS.md).
#
#   ci/prometheus.sh install      install Debian's prometheus (prometheus and
#                                 promtool) if missing
#   ci/prometheus.sh check        promtool check rules ops/prometheus/alerts.yml,
#                                 then promtool test rules
#                                 ops/prometheus/alerts_test.yml (the unit tests
#                                 of every alert on synthetic series)
#   ci/prometheus.sh start TARGET [RULES...]
#                                 start one Prometheus on 127.0.0.1:$SPATE_PROM_PORT
#                                 (default 19090) scraping TARGET (host:port of a
#                                 `spate run` admin server, path /metrics) every
#                                 $SPATE_PROM_INTERVAL (default 1s) and evaluating
#                                 RULES (rule files) as often; wait until it is
#                                 ready (/-/ready); print its URL. Fails, with the
#                                 server's log, when it does not get ready within
#                                 $SPATE_PROM_WAIT_SECS (default 30)
#   ci/prometheus.sh stop         stop the instance started here, remove state
#
# Everything (config, TSDB, log, pid) lives under $SPATE_PROM_DIR (default
# /tmp/spate-prometheus); give each instance its own directory and port to
# run several side by side. The fast intervals are for tests: a production
# Prometheus scrapes every 15-30 s (ops/k8s/podmonitor.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT="${SPATE_PROM_DIR:-/tmp/spate-prometheus}"
PORT="${SPATE_PROM_PORT:-19090}"
INTERVAL="${SPATE_PROM_INTERVAL:-1s}"
WAIT_SECS="${SPATE_PROM_WAIT_SECS:-30}"

log() { printf 'prometheus.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

install_if_missing() {
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    return
  fi
  log "installing prometheus (Debian package; gives prometheus and promtool)"
  export DEBIAN_FRONTEND=noninteractive
  # The apt lock may be held by another installer for a while: retry.
  local i
  for i in $(seq 1 30); do
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; then
      break
    fi
    log "apt-get failed (lock held?), try $i of 30; again in 10 s"
    sleep 10
  done
  command -v prometheus >/dev/null && command -v promtool >/dev/null ||
    die "prometheus/promtool still missing after apt-get install prometheus"
}

# GET $1 from 127.0.0.1:$PORT; true on a 200. bash's /dev/tcp, not curl
# (not always installed).
http_ok() {
  timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$1" >&3
    read -r _ status _ <&3 || exit 1
    [[ "$status" == 200 ]]' "$PORT" "$1" 2>/dev/null
}

check_rules() {
  install_if_missing
  promtool check rules ops/prometheus/alerts.yml
  # Test files name their rule files relative to themselves.
  (cd ops/prometheus && promtool test rules alerts_test.yml)
}

start() {
  local target="${1:?usage: ci/prometheus.sh start HOST:PORT [RULES...]}"
  shift
  install_if_missing
  if [[ -f "$ROOT/pid" ]] && kill -0 "$(cat "$ROOT/pid")" 2>/dev/null; then
    die "an instance already runs from $ROOT (pid $(cat "$ROOT/pid")): ci/prometheus.sh stop first"
  fi
  # Another server on the port would answer /-/ready for us.
  if timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"' "$PORT" 2>/dev/null; then
    die "127.0.0.1:$PORT is taken by another server: pick another SPATE_PROM_PORT"
  fi
  rm -rf "$ROOT"
  mkdir -p "$ROOT/data" "$ROOT/rules"
  local rule_lines="" n=0 f
  for f in "$@"; do
    [[ -f "$f" ]] || die "rule file $f does not exist"
    cp "$f" "$ROOT/rules/$n-$(basename "$f")"
    rule_lines+="  - $ROOT/rules/$n-$(basename "$f")"$'\n'
    n=$((n + 1))
  done
  cat >"$ROOT/prometheus.yml" <<EOF
global:
  scrape_interval: $INTERVAL
  scrape_timeout: $INTERVAL
  evaluation_interval: $INTERVAL
rule_files:
${rule_lines:-  []}
scrape_configs:
  - job_name: spate
    metrics_path: /metrics
    static_configs:
      - targets: ["$target"]
EOF
  promtool check config "$ROOT/prometheus.yml" >&2 || die "generated config $ROOT/prometheus.yml is invalid"
  prometheus \
    --config.file="$ROOT/prometheus.yml" \
    --storage.tsdb.path="$ROOT/data" \
    --web.listen-address="127.0.0.1:$PORT" \
    --web.enable-lifecycle \
    >"$ROOT/log" 2>&1 &
  echo $! >"$ROOT/pid"
  local url="http://127.0.0.1:$PORT" deadline=$((SECONDS + WAIT_SECS))
  until http_ok /-/ready; do
    if ! kill -0 "$(cat "$ROOT/pid")" 2>/dev/null; then
      cat "$ROOT/log" >&2
      die "prometheus exited before it got ready (log above)"
    fi
    if ((SECONDS > deadline)); then
      cat "$ROOT/log" >&2
      stop
      die "prometheus not ready at $url within ${WAIT_SECS}s (log above)"
    fi
    sleep 0.2
  done
  log "prometheus ready at $url (pid $(cat "$ROOT/pid")), scraping $target every $INTERVAL"
  echo "$url"
}

stop() {
  if [[ -f "$ROOT/pid" ]]; then
    local pid
    pid=$(cat "$ROOT/pid")
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -rf "$ROOT"
}

case "${1:-}" in
  install) install_if_missing ;;
  check) check_rules ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  *) die "usage: ci/prometheus.sh install | check | start HOST:PORT [RULES...] | stop" ;;
esac
