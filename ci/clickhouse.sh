#!/usr/bin/env bash
# Local ClickHouse servers for spate's real-server tests (docs/DESIGN.md
# "Real components in tests"; shared/ENVIRONMENT.md records how this was done
# by hand).
#
#   ci/clickhouse.sh start [N]   install Debian's clickhouse-server/-client if
#                                missing, start N instances (default 1) on
#                                127.0.0.1, wait until each answers SELECT 1,
#                                print their HTTP URLs
#   ci/clickhouse.sh start-replicated SHARDS REPLICAS
#                                as start, but SHARDS x REPLICAS instances that
#                                are real replicas: install Debian's zookeeper
#                                if missing, start one ZooKeeper on
#                                127.0.0.1:$SPATE_ZK_PORT (default 2181) with
#                                its own dataDir, give every instance
#                                <zookeeper>, <macros> (shard 01.., replica
#                                r1..) and <interserver_http_host>127.0.0.1;
#                                print one line per shard: its replicas' HTTP
#                                URLs, comma-separated
#   ci/clickhouse.sh shards      print the replicated layout again, as above
#   ci/clickhouse.sh urls        print the running instances' HTTP URLs
#   ci/clickhouse.sh stop        stop every instance (and the ZooKeeper)
#                                started here, remove state
#
# Instance i gets HTTP port BASE+10*i, native port BASE+10*i+1, interserver
# port BASE+10*i+2 (BASE: $SPATE_CH_BASE_PORT, default 18123) and its own
# config, data and logs under $SPATE_CH_DIR (default /tmp/spate-clickhouse).
# Each takes about 80 MB resident. Use the first URL for the tests:
#
#   export SPATE_CLICKHOUSE_URL=$(ci/clickhouse.sh start 1 | head -n1)
#   cargo test -p spate-clickhouse --test it real_server
#
# Replicated: replica r (0-based) of shard s is instance s*REPLICAS+r, so its
# ports follow the same rule. For the replication tests (a separate directory
# and port range, so they do not meet the plain instances above):
#
#   export SPATE_CH_DIR=/tmp/spate-ch-repl SPATE_CH_BASE_PORT=19123
#   export SPATE_CLICKHOUSE_SHARDS=$(ci/clickhouse.sh start-replicated 2 2 | paste -sd';')
#   cargo test -p spate-clickhouse --test it replicated
#   ci/clickhouse.sh stop
#
# Tables there use
#   ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/<db>_<table>', '{replica}')
# and every instance of that layout knows the cluster `spate_weighted` (in
# config.d/spate-cluster.xml): the same shards and replicas over the native
# ports, shard s with weight 3s+2 (2, 5: a total of 7, which does not divide
# 2^32 (2^32-1), so a 32-bit key sign-extended wrongly shows) and
# internal_replication, for Distributed
# tables that check spate's routing against the engine's.
# The ZooKeeper (about 85 MB resident) keeps its data under $SPATE_CH_DIR/zk.
#
# $SPATE_CH_EXTRA_CONFIG (optional): an XML file (root element <yandex>) copied
# into every instance's config.d/, which the server merges over config.xml;
# e.g. ci/peer-bench.sh passes <kafka><auto_offset_reset>smallest</...> so the
# Kafka table engine reads a backlog. Unset: nothing is added.
set -euo pipefail

ROOT="${SPATE_CH_DIR:-/tmp/spate-clickhouse}"
BASE="${SPATE_CH_BASE_PORT:-18123}"
WAIT_SECS="${SPATE_CH_WAIT_SECS:-60}"
ZK_PORT="${SPATE_ZK_PORT:-2181}"
EXTRA_CONFIG="${SPATE_CH_EXTRA_CONFIG:-}"

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

zookeeper_if_missing() {
  if [[ -f /usr/share/java/zookeeper.jar ]] && command -v java >/dev/null; then
    return
  fi
  log "installing zookeeper (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq zookeeper >/dev/null
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

zk_answers() {
  # ZooKeeper's four-letter word `ruok` (whitelisted in zoo.cfg): `imok`.
  local reply
  reply=$(timeout 5 bash -c '
    exec 3<>"/dev/tcp/127.0.0.1/$0" || exit 1
    printf "ruok" >&3
    cat <&3' "$ZK_PORT" 2>/dev/null) || return 1
  [[ "$reply" == imok ]]
}

start_zk() {
  local dir="$ROOT/zk" deadline
  if [[ -f "$dir/pid" ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    log "zookeeper already running (pid $(cat "$dir/pid"))"
    return
  fi
  if zk_answers; then
    log "port $ZK_PORT already answers as a ZooKeeper not started from $ROOT; set SPATE_ZK_PORT"
    exit 1
  fi
  mkdir -p "$dir/data" "$dir/log"
  printf '%s\n' \
    "tickTime=2000" \
    "initLimit=10" \
    "syncLimit=5" \
    "dataDir=$dir/data" \
    "clientPort=$ZK_PORT" \
    "clientPortAddress=127.0.0.1" \
    "admin.enableServer=false" \
    "4lw.commands.whitelist=ruok" \
    "maxClientCnxns=200" >"$dir/zoo.cfg"
  # Java expands the `*` classpath entry itself (the jars of Debian's
  # zookeeper package and its dependencies).
  (
    cd "$dir" || exit 1
    nohup java -Xmx256m -Dzookeeper.log.dir="$dir/log" \
      -cp "/usr/share/java/zookeeper.jar:/usr/share/java/*" \
      org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
      >"$dir/log/stdout.log" 2>&1 &
    echo $! >"$dir/pid"
  )
  deadline=$((SECONDS + WAIT_SECS))
  until zk_answers; do
    if ((SECONDS > deadline)) || ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      log "zookeeper exited or did not answer on port $ZK_PORT within ${WAIT_SECS}s; last log lines:"
      tail -n 20 "$dir/log/stdout.log" >&2 || true
      exit 1
    fi
    sleep 0.5
  done
  log "zookeeper: pid $(cat "$dir/pid") answers on 127.0.0.1:$ZK_PORT, data $dir/data"
}

# The config elements that make an instance a replica: ZooKeeper, its macros
# (shard SHARD+1 as two digits, replica rREPLICA+1) and the interserver host
# other replicas fetch parts from.
replica_xml() {
  local shard=$1 replica=$2
  printf '    <zookeeper><node><host>127.0.0.1</host><port>%s</port></node></zookeeper>\n' "$ZK_PORT"
  printf '    <macros><shard>%02d</shard><replica>r%d</replica></macros>\n' "$((shard + 1))" "$((replica + 1))"
  printf '    <interserver_http_host>127.0.0.1</interserver_http_host>\n'
}

# cluster_xml SHARDS REPLICAS: the `spate_weighted` cluster (see the header).
cluster_xml() {
  local s r
  printf '<yandex><remote_servers><spate_weighted>\n'
  for ((s = 0; s < $1; s++)); do
    printf '  <shard><weight>%d</weight><internal_replication>true</internal_replication>\n' "$((3 * s + 2))"
    for ((r = 0; r < $2; r++)); do
      printf '    <replica><host>127.0.0.1</host><port>%d</port></replica>\n' "$(($(http_port $((s * $2 + r))) + 1))"
    done
    printf '  </shard>\n'
  done
  printf '</spate_weighted></remote_servers></yandex>\n'
}

# start_one I [SHARD REPLICA]: start instance I; a replica when SHARD is given.
start_one() {
  local i=$1 dir="$ROOT/ch$1" http tcp inter extra=""
  http=$(http_port "$i"); tcp=$((http + 1)); inter=$((http + 2))
  if [[ -f "$dir/pid" ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    log "instance $i already running (pid $(cat "$dir/pid"))"
    return
  fi
  if [[ -n "${2:-}" ]]; then
    extra=$(replica_xml "$2" "$3")
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
  if [[ -n "$extra" ]]; then
    # Real elements instead of the optional includes (a second <zookeeper>
    # next to the include would be ambiguous), before the closing root tag.
    local tmp="$dir/config.xml.tmp" line
    while IFS= read -r line || [[ -n "$line" ]]; do
      case "$line" in
        *'<zookeeper incl="zookeeper-servers"'*) ;;
        *'<macros incl="macros"'*) ;;
        '</yandex>'*) printf '%s\n%s\n' "$extra" "$line" ;;
        *) printf '%s\n' "$line" ;;
      esac
    done <"$dir/config.xml" >"$tmp"
    mv "$tmp" "$dir/config.xml"
    grep -q '<macros><shard>' "$dir/config.xml" || { log "instance $i: could not add the replica settings"; exit 1; }
  fi
  cp /etc/clickhouse-server/users.xml "$dir/users.xml"
  if [[ -n "${2:-}" ]]; then
    mkdir -p "$dir/config.d"
    cluster_xml "$nshards" "$nreplicas" >"$dir/config.d/spate-cluster.xml"
  fi
  if [[ -n "$EXTRA_CONFIG" ]]; then
    [[ -f "$EXTRA_CONFIG" ]] || { log "SPATE_CH_EXTRA_CONFIG=$EXTRA_CONFIG: no such file"; exit 1; }
    mkdir -p "$dir/config.d"
    cp "$EXTRA_CONFIG" "$dir/config.d/"
  fi
  # `&` on the simple command alone, so $! is nohup, which execs the server
  # (backgrounding `cd && nohup ...` would record a subshell's pid instead).
  (
    cd "$dir" || exit 1
    nohup clickhouse-server --config-file="$dir/config.xml" >"$dir/log/stdout.log" 2>&1 &
    echo $! >"$dir/pid"
  )
  log "instance $i: pid $(cat "$dir/pid"), http $http, native $tcp, data $dir${2:+, shard $(($2 + 1)) replica r$(($3 + 1))}"
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

# One line per shard: its replicas' HTTP URLs, comma-separated.
shards() {
  local s r nshards nreplicas line
  if [[ ! -f "$ROOT/layout" ]]; then
    log "no replicated layout under $ROOT (start-replicated was not run there)"
    exit 1
  fi
  read -r nshards nreplicas <"$ROOT/layout"
  for ((s = 0; s < nshards; s++)); do
    line=""
    for ((r = 0; r < nreplicas; r++)); do
      line+="${line:+,}http://127.0.0.1:$(http_port $((s * nreplicas + r)))"
    done
    echo "$line"
  done
}

stop_all() {
  local d pid
  for d in "$ROOT"/ch* "$ROOT"/zk; do
    [[ -f "$d/pid" ]] || continue
    pid=$(cat "$d/pid")
    # A replica a test froze with SIGSTOP must run again to see SIGTERM.
    kill -CONT "$pid" 2>/dev/null || true
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      log "stopped pid $pid (${d##*/})"
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
  start-replicated)
    nshards="${2:?usage: $0 start-replicated SHARDS REPLICAS}"
    nreplicas="${3:?usage: $0 start-replicated SHARDS REPLICAS}"
    install_if_missing
    zookeeper_if_missing
    mkdir -p "$ROOT"
    echo "$nshards $nreplicas" >"$ROOT/layout"
    start_zk
    for ((s = 0; s < nshards; s++)); do
      for ((r = 0; r < nreplicas; r++)); do start_one $((s * nreplicas + r)) "$s" "$r"; done
    done
    for ((i = 0; i < nshards * nreplicas; i++)); do wait_one "$i"; done
    shards
    ;;
  shards) shards ;;
  urls) urls ;;
  stop) stop_all ;;
  *)
    echo "usage: $0 start [N] | start-replicated SHARDS REPLICAS | shards | urls | stop" >&2
    exit 2
    ;;
esac
