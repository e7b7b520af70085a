#!/usr/bin/env bash
# Local ClickHouse servers for spate's real-server tests (docs/DESIGN.md
# "Real components in tests"; shared/ENVIRONMENT.md records how this was done
# by hand).
#
#   ci/clickhouse.sh start [N]   install Debian's clickhouse-server/-client if
#                                missing, start N instances (default 1) on
#                                127.0.0.1, wait until each answers SELECT 1,
#                                print their HTTP URLs
#   ci/clickhouse.sh urls        print the running instances' HTTP URLs
#   ci/clickhouse.sh stop        stop every instance started here, remove state
#
# Instance i gets HTTP port BASE+10*i, native port BASE+10*i+1, interserver
# port BASE+10*i+2 (BASE: $SPATE_CH_BASE_PORT, default 18123) and its own
# config, data and logs under $SPATE_CH_DIR (default /tmp/spate-clickhouse).
# Each takes about 80 MB resident. Use the first URL for the tests:
#
#   export SPATE_CLICKHOUSE_URL=$(ci/clickhouse.sh start 1 | head -n1)
#   cargo test -p spate-clickhouse --test real_server
#
# Not yet: ZooKeeper and ReplicatedMergeTree replicas (issue 6).
set -euo pipefail

ROOT="${SPATE_CH_DIR:-/tmp/spate-clickhouse}"
BASE="${SPATE_CH_BASE_PORT:-18123}"
WAIT_SECS="${SPATE_CH_WAIT_SECS:-60}"

log() { printf 'clickhouse.sh: %s\n' "$*" >&2; }

install_if_missing() {
  if command -v clickhouse-server >/dev/null && command -v clickhouse-client >/dev/null; then
    return
  fi
  log "installing clickhouse-server and clickhouse-client (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq clickhouse-server clickhouse-client >/dev/null
}

http_port() { echo $((BASE + 10 * $1)); }

answers() {
  # SELECT 1 over HTTP without curl (not always installed): bash's /dev/tcp.
  local port=$1 reply
  reply=$(timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "GET /?query=SELECT%%201 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" >&3
    cat <&3' "$port" 2>/dev/null) || return 1
  [[ "$reply" == *$'\r\n\r\n1'* ]]
}

start_one() {
  local i=$1 dir="$ROOT/ch$1" http tcp inter
  http=$(http_port "$i"); tcp=$((http + 1)); inter=$((http + 2))
  if [[ -f "$dir/pid" ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    log "instance $i already running (pid $(cat "$dir/pid"))"
    return
  fi
  mkdir -p "$dir"/{data,tmp,user_files,format_schemas,log}
  sed -e "s#<http_port>8123</http_port>#<http_port>$http</http_port>#" \
      -e "s#<tcp_port>9000</tcp_port>#<tcp_port>$tcp</tcp_port>#" \
      -e "s#<interserver_http_port>9009</interserver_http_port>#<interserver_http_port>$inter</interserver_http_port>#" \
      -e "s#/var/lib/clickhouse/#$dir/data/#g" \
      -e "s#$dir/data/tmp/#$dir/tmp/#" \
      -e "s#/var/log/clickhouse-server/#$dir/log/#g" \
      -e "s#<listen_host>::1</listen_host>##" \
      /etc/clickhouse-server/config.xml >"$dir/config.xml"
  cp /etc/clickhouse-server/users.xml "$dir/users.xml"
  # `&` on the simple command alone, so $! is nohup, which execs the server
  # (backgrounding `cd && nohup ...` would record a subshell's pid instead).
  (
    cd "$dir" || exit 1
    nohup clickhouse-server --config-file="$dir/config.xml" >"$dir/log/stdout.log" 2>&1 &
    echo $! >"$dir/pid"
  )
  log "instance $i: pid $(cat "$dir/pid"), http $http, native $tcp, data $dir"
}

wait_one() {
  local i=$1 port deadline
  port=$(http_port "$i")
  deadline=$((SECONDS + WAIT_SECS))
  until answers "$port"; do
    if ((SECONDS > deadline)) || ! kill -0 "$(cat "$ROOT/ch$i/pid")" 2>/dev/null; then
      log "instance $i exited or did not answer SELECT 1 on port $port within ${WAIT_SECS}s; last log lines:"
      tail -n 20 "$ROOT/ch$i/log/clickhouse-server.err.log" >&2 2>/dev/null || true
      tail -n 20 "$ROOT/ch$i/log/stdout.log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.5
  done
  log "instance $i: pid $(cat "$ROOT/ch$i/pid") answers on port $port"
}

urls() {
  local d
  for d in "$ROOT"/ch*; do
    [[ -f "$d/pid" ]] || continue
    echo "http://127.0.0.1:$(http_port "${d##*/ch}")"
  done
}

stop_all() {
  local d pid
  for d in "$ROOT"/ch*; do
    [[ -f "$d/pid" ]] || continue
    pid=$(cat "$d/pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      log "stopped pid $pid"
    fi
  done
  rm -rf "$ROOT"
}

case "${1:-}" in
  start)
    n="${2:-1}"
    install_if_missing
    mkdir -p "$ROOT"
    for ((i = 0; i < n; i++)); do start_one "$i"; done
    for ((i = 0; i < n; i++)); do wait_one "$i"; done
    urls
    ;;
  urls) urls ;;
  stop) stop_all ;;
  *)
    echo "usage: $0 start [N] | urls | stop" >&2
    exit 2
    ;;
esac
