#!/usr/bin/env bash
# A local Apache Kafka 4.4.0 cluster for spate's real-broker tests (issue 14;
# docs/VERIFICATION.md "Real Kafka and the mock cluster"). Same shape as ci/clickhouse.sh.
#
#   ci/kafka.sh start [N]        install a JRE, Maven and kcat with apt-get if
#                                missing, fetch the broker and its runtime jars
#                                from Maven Central (ci/kafka/pom.xml, pinned;
#                                copied to $SPATE_KAFKA_LIBS, the downloads kept
#                                in the Maven cache), format KRaft storage and
#                                start N nodes (default 3) on 127.0.0.1, each a
#                                combined controller+broker (one 3-voter quorum
#                                when N=3); wait until every broker is
#                                registered (kcat metadata lists all N); print
#                                the bootstrap list (host:port,...)
#   ci/kafka.sh bootstrap        print the bootstrap list again
#   ci/kafka.sh kill-broker I    kill -9 node I (1-based); its data stays
#   ci/kafka.sh start-broker I [--no-wait]
#                                start node I again on its data, wait until
#                                it answers (a quorum of the other nodes must
#                                be up); --no-wait returns once it is spawned
#   ci/kafka.sh start-all        start every node that is not running (all
#                                of them after a full outage: none can answer
#                                before a quorum is back, so they start
#                                together), then wait until each lists all N
#                                brokers
#   ci/kafka.sh pid I            print node I's pid
#   ci/kafka.sh stop             stop every node started here, remove state
#
# Node i (1..N) listens for clients on 127.0.0.1:BASE+i-1 and for the quorum
# on 127.0.0.1:BASE+100+i-1 (BASE: $SPATE_KAFKA_BASE_PORT, default 29092: clear
# of ci/clickhouse.sh's 18123.., 19123.. and 2181); config, data and logs under
# $SPATE_KAFKA_DIR (default /tmp/spate-kafka). Defaults for every topic:
# replication factor min(3,N), min.insync.replicas 2 (1 when N=1); the
# offsets and transaction-state topics likewise (5 partitions each, so the
# first group or transaction is quick); group.initial.rebalance.delay.ms 0;
# the KIP-848 (group.protocol=consumer) session timeout 6 s and heartbeat
# 500 ms, as the classic-protocol tests set on the client (the broker's 45 s
# default made a killed member's partitions wait 45 s);
# log.cleaner.backoff.ms 500 (a compacted test topic is cleaned within a
# second of its segments rolling, not after the default 15 s);
# no automatic topic creation (tests create theirs, with RF and partitions);
# message.max.bytes 16 MiB (spate_kafka::tools::MAX_MESSAGE_BYTES: the e2e
# poison record is 2 MiB).
#
#   export SPATE_KAFKA_BROKERS=$(ci/kafka.sh start | tail -n1)
#   SPATE_KAFKA_BROKERS=... cargo test -p spate --test it -- real_kafka::
#   ci/kafka.sh stop
#
# Measured on this machine kind (2 cores shared with other work, 24 GiB;
# 3 nodes, -Xmx384m each; measured, never asserted):
#   start cold (empty Maven cache: 65 MB downloaded, 43 MB of jars)  14 s
#   start warm (jars cached, fresh data dirs)    8-16 s; 60 s beside a
#                                                release build
#   resident memory per node, idle after start   300-340 MB
#   resident memory per node after 2 M rows      550-600 MB
#   stop (controlled shutdown of all nodes)      about 16 s
#   start-all after kill -9 of every node        about 18 s (log recovery,
#                                                quorum, registration)
#
# $SPATE_KAFKA_HEAP (default -Xmx384m -Xms64m) sets each JVM's heap.
# Never a silent skip: a node that exits or does not register within
# $SPATE_KAFKA_WAIT_SECS (default 180) fails `start` with its last log lines.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
ROOT="${SPATE_KAFKA_DIR:-/tmp/spate-kafka}"
BASE="${SPATE_KAFKA_BASE_PORT:-29092}"
WAIT_SECS="${SPATE_KAFKA_WAIT_SECS:-180}"
LIBS="${SPATE_KAFKA_LIBS:-$REPO/target/kafka-libs}"
HEAP="${SPATE_KAFKA_HEAP:--Xmx384m -Xms64m}"
# A fixed cluster id (base64url of 16 bytes, the form Kafka's Uuid takes):
# storage is formatted fresh on every `start`, so one id is enough.
CLUSTER_ID="c3BhdGUtY2ktY2x1c3Rlcg"

log() { printf 'kafka.sh: %s\n' "$*" >&2; }

client_port() { echo $((BASE + $1 - 1)); }
quorum_port() { echo $((BASE + 100 + $1 - 1)); }

install_if_missing() {
  local need=()
  command -v java >/dev/null || need+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null || need+=(maven)
  command -v kcat >/dev/null || need+=(kcat)
  ((${#need[@]} == 0)) && return
  log "installing ${need[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

fetch_jars() {
  # Marker: the pom's checksum, so a changed pin refetches.
  local sum
  sum=$(sha256sum "$HERE/kafka/pom.xml" | cut -c1-16)
  if [[ -f "$LIBS/.pom-$sum" ]]; then
    return
  fi
  log "fetching Apache Kafka 4.4.0 and its runtime jars (mvn dependency:copy-dependencies)"
  rm -rf "$LIBS"
  mkdir -p "$LIBS"
  if ! mvn -q -B -f "$HERE/kafka/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$LIBS" >"$LIBS/.mvn.log" 2>&1; then
    log "mvn could not fetch the broker jars; its output:"
    tail -n 40 "$LIBS/.mvn.log" >&2
    exit 1
  fi
  touch "$LIBS/.pom-$sum"
}

node_count() { cat "$ROOT/nodes"; }

write_config() {
  local i=$1 n=$2 dir="$ROOT/node$1" voters="" j rf isr
  rf=$((n < 3 ? n : 3))
  isr=$((rf < 2 ? 1 : 2))
  for ((j = 1; j <= n; j++)); do
    voters+="${voters:+,}$j@127.0.0.1:$(quorum_port "$j")"
  done
  mkdir -p "$dir/data" "$dir/log"
  cat >"$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$(client_port "$i"),CONTROLLER://127.0.0.1:$(quorum_port "$i")
advertised.listeners=PLAINTEXT://127.0.0.1:$(client_port "$i")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
group.consumer.min.session.timeout.ms=6000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=500
log.cleaner.backoff.ms=500
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.retention.hours=24
auto.create.topics.enable=false
delete.topic.enable=true
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
EOF
  cat >"$dir/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $dir/log/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = org.apache.kafka
logger.kafka.level = INFO
EOF
}

# java_args DIR: the JVM options for node DIR, into the array JAVA (Java
# expands the `*` classpath entry itself).
java_args() {
  local heap
  read -r -a heap <<<"$HEAP"
  JAVA=(java "${heap[@]}" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$1/log4j2.properties" -cp "$LIBS/*")
}

format_one() {
  local i=$1 dir="$ROOT/node$1"
  java_args "$dir"
  if ! "${JAVA[@]}" kafka.tools.StorageTool format --cluster-id "$CLUSTER_ID" \
      --config "$dir/server.properties" --ignore-formatted >"$dir/log/format.log" 2>&1; then
    log "node $i: formatting KRaft storage failed:"
    tail -n 20 "$dir/log/format.log" >&2
    exit 1
  fi
}

start_one() {
  local i=$1 dir="$ROOT/node$1"
  if [[ -f "$dir/pid" ]] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
    log "node $i already running (pid $(cat "$dir/pid"))"
    return
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$(client_port "$i")") 2>/dev/null; then
    log "port $(client_port "$i") already answers, not a node started from $ROOT; set SPATE_KAFKA_BASE_PORT"
    exit 1
  fi
  java_args "$dir"
  (
    cd "$dir" || exit 1
    nohup "${JAVA[@]}" kafka.Kafka "$dir/server.properties" >"$dir/log/stdout.log" 2>&1 &
    echo $! >"$dir/pid"
  )
  log "node $i: pid $(cat "$dir/pid"), client 127.0.0.1:$(client_port "$i"), quorum $(quorum_port "$i"), data $dir"
}

bootstrap() {
  local n i line=""
  n=$(node_count)
  for ((i = 1; i <= n; i++)); do line+="${line:+,}127.0.0.1:$(client_port "$i")"; done
  echo "$line"
}

# How many brokers node I's metadata lists (0 when it does not answer).
registered() {
  local out
  out=$(timeout 10 kcat -b "127.0.0.1:$(client_port "$1")" -L -m 5 2>/dev/null) || { echo 0; return; }
  grep -Eo '^ *[0-9]+ brokers:' <<<"$out" | grep -Eo '[0-9]+' || echo 0
}

# wait_one I WANT: until node I answers and lists WANT brokers.
wait_one() {
  local i=$1 want=$2 deadline dir="$ROOT/node$1"
  deadline=$((SECONDS + WAIT_SECS))
  until [[ "$(registered "$i")" -ge "$want" ]]; do
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      log "node $i (pid $(cat "$dir/pid")) exited before $want brokers were registered; last log lines:"
      tail -n 20 "$dir/log/stdout.log" >&2 2>/dev/null || true
      tail -n 30 "$dir/log/server.log" >&2 2>/dev/null || true
      exit 1
    fi
    if ((SECONDS > deadline)); then
      log "node $i (pid $(cat "$dir/pid"), running) listed $(registered "$i") of $want brokers after ${WAIT_SECS}s; its errors and last log lines:"
      grep -E 'ERROR|FATAL|Exception' "$dir/log/server.log" 2>/dev/null | tail -n 10 >&2 || true
      tail -n 20 "$dir/log/server.log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 0.5
  done
}

stop_all() {
  local d pid
  for d in "$ROOT"/node*; do
    [[ -f "$d/pid" ]] || continue
    pid=$(cat "$d/pid")
    kill -CONT "$pid" 2>/dev/null || true
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
    fi
  done
  # Controlled shutdown of all nodes together (one at a time would move
  # leadership around for nothing); then kill what is left.
  for d in "$ROOT"/node*; do
    [[ -f "$d/pid" ]] || continue
    pid=$(cat "$d/pid")
    for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    log "stopped pid $pid (${d##*/})"
  done
  rm -rf "$ROOT"
}

need_node() {
  local i=${1:?usage: $0 $2 I}
  [[ -f "$ROOT/nodes" ]] || { log "no cluster under $ROOT"; exit 1; }
  if ! [[ "$i" =~ ^[0-9]+$ ]] || ((i < 1 || i > $(node_count))); then
    log "no node $i (1..$(node_count))"
    exit 1
  fi
}

case "${1:-}" in
  start)
    n="${2:-3}"
    install_if_missing
    fetch_jars
    if [[ -f "$ROOT/nodes" ]]; then
      for d in "$ROOT"/node*; do
        if [[ -f "$d/pid" ]] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then
          log "a cluster is already running under $ROOT (pid $(cat "$d/pid")); run stop first"
          exit 1
        fi
      done
      log "removing the state of a cluster under $ROOT that no longer runs"
      rm -rf "$ROOT"
    fi
    t0=$SECONDS
    mkdir -p "$ROOT"
    echo "$n" >"$ROOT/nodes"
    for ((i = 1; i <= n; i++)); do write_config "$i" "$n"; done
    # The formats are independent JVMs: run them side by side.
    pids=()
    for ((i = 1; i <= n; i++)); do format_one "$i" & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || { log "formatting failed"; exit 1; }; done
    for ((i = 1; i <= n; i++)); do start_one "$i"; done
    for ((i = 1; i <= n; i++)); do wait_one "$i" "$n"; done
    log "$n brokers registered after $((SECONDS - t0))s (from format)"
    bootstrap
    ;;
  bootstrap) bootstrap ;;
  pid)
    need_node "${2:-}" pid
    cat "$ROOT/node$2/pid"
    ;;
  kill-broker)
    need_node "${2:-}" kill-broker
    pid=$(cat "$ROOT/node$2/pid")
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    log "node $2: killed pid $pid"
    ;;
  start-broker)
    need_node "${2:-}" start-broker
    case "${3:-}" in
      "") start_one "$2"; wait_one "$2" 1; log "node $2 answers again" ;;
      --no-wait) start_one "$2" ;;
      *) log "start-broker: unknown option ${3} (known: --no-wait)"; exit 2 ;;
    esac
    ;;
  start-all)
    [[ -f "$ROOT/nodes" ]] || { log "no cluster under $ROOT"; exit 1; }
    n=$(node_count)
    t0=$SECONDS
    for ((i = 1; i <= n; i++)); do start_one "$i"; done
    for ((i = 1; i <= n; i++)); do wait_one "$i" "$n"; done
    log "$n brokers registered again after $((SECONDS - t0))s"
    ;;
  stop) stop_all ;;
  *)
    echo "usage: $0 start [N] | bootstrap | pid I | kill-broker I | start-broker I [--no-wait] | start-all | stop" >&2
    exit 2
    ;;
esac
