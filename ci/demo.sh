#!/usr/bin/env bash
# The main job on one machine (README "The two commands"): `spate demo` moves flight rows
# from an embedded Kafka broker into ClickHouse and prints what landed: the
# delivery mode it ran (`--delivery at_least_once`, the default, or
# `--delivery effectively_once`) and its duplicate count among the rest.
#
#   bash ci/demo.sh [--clickhouse-url URL] [other `spate demo` flags]
#
# When URL (default http://127.0.0.1:8123) does not answer, a local
# ClickHouse is installed where missing and started by ci/clickhouse.sh in its
# own directory and port range, and stopped again when the demo ends.
set -euo pipefail
cd "$(dirname "$0")/.."

url="http://127.0.0.1:8123"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --clickhouse-url) url="$2"; shift 2 ;;
    --clickhouse-url=*) url="${1#*=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done

answers() {
  command -v curl >/dev/null 2>&1 &&
    [ "$(curl -fsS --max-time 3 "$1/?query=SELECT%201" 2>/dev/null)" = "1" ]
}

if ! answers "$url"; then
  echo "demo: no ClickHouse answers at $url; starting one with ci/clickhouse.sh" >&2
  export SPATE_CH_DIR="${SPATE_CH_DIR:-/tmp/spate-ch-demo}"
  export SPATE_CH_BASE_PORT="${SPATE_CH_BASE_PORT:-18823}"
  trap 'bash ci/clickhouse.sh stop >/dev/null 2>&1 || true' EXIT
  url=$(bash ci/clickhouse.sh start 1 | head -n1)
fi

cargo run --release -p spate -- demo --clickhouse-url "$url" "${args[@]}"
