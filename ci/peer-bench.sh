#!/usr/bin/env bash
# Side-by-side benchmark (second edition, issue 22): spate (at_least_once
# and effectively_once), ClickHouse's own Kafka table engine, a plain Python
# consumer loop and clickhouse_sinker, each moving the same ROWS flight rows
# from one pre-filled topic into the same ClickHouse, one arm at a time,
# arms interleaved over PEER_BENCH_REPS repetitions (rotated: rep 1 runs
# A B C, rep 2 B C A, ...), reported as medians with ranges.
#
#   bash ci/peer-bench.sh [--kafka real|mock] [--reps N] [ROWS]
#       --kafka real (default): a real Apache Kafka 4.4 cluster,
#                     ci/kafka.sh start 3 (KRaft, RF 3, min.insync.replicas
#                     2), a topic of PEER_BENCH_PARTITIONS (default 12)
#                     partitions, stopped at the end
#       --kafka mock: the embedded broker (librdkafka's mock cluster)
#       --reps N:     repetitions (default 3)
#       ROWS:         flight rows (default 1,000,000)
#
# Gates: a run passes when every row landed exactly once (count() = ROWS
# and uniqExact(id) = ROWS) and the arm did not stall, time out or exit. A
# run that fails a gate is reported as failed with its reason, never as a
# number: medians and ranges are over the passing runs only, and the table
# says how many of the repetitions passed.
#
# clickhouse_sinker: `go install github.com/housepower/clickhouse_sinker/
# cmd/clickhouse_sinker@$PEER_BENCH_SINKER_VERSION` (the ordinary Go
# tooling through the Go module proxy). Where the proxy does not serve the
# module (measured 2026-12-01 on this machine kind: HTTP 403 "This module
# version is not available" for every version and for the version list),
# the arm is reported as not run with the go command's own message.
#
# The table: every arm writes into the same ReplicatedMergeTree (one
# replica, replicated_deduplication_window = 10000, on ClickHouse 18.16 with
# a local ZooKeeper): effectively_once needs a table that deduplicates, and
# the same table for every arm keeps the comparison fair. 18.16 needs no
# other adaptation for flights (no DateTime64, no LowCardinality used).
#
# What it does (everything it needs is installed here; it is a benchmark, not
# part of ci/test.sh):
#   1. cargo build --release -p spate; a venv under $CARGO_TARGET_DIR with
#      confluent-kafka from PyPI (ci/peer_bench.py runs in it).
#   2. ROWS flight rows: engine/spate/fixtures/flights-20k.ndjson repeated
#      with distinct ids 0..ROWS-1 (as `spate demo` does).
#   3. `spate broker` (librdkafka's mock cluster) with enough partitions that
#      each stays well under its 5 MiB retention, loaded ONCE by `spate
#      produce` (keys spread evenly over the partitions).
#   4. ClickHouse 18.16 via ci/clickhouse.sh with an extra config.d file
#      setting <kafka><auto_offset_reset>smallest</auto_offset_reset></kafka>
#      (the Kafka engine otherwise starts at the end of a backlog), plus
#      <logger><level>trace</level></logger> and <kafka><debug>cgrp</debug>
#      for the engine's timing (see "4." below).
#   5. For each system, in its own consumer group and into a fresh MergeTree
#      table: check every partition's low watermark is still 0 (fail
#      otherwise), start it, poll count() until ROWS landed (or it times out
#      or stalls: the row then shows what landed), read CPU and peak RSS from
#      /proc, stop it, count rows and duplicates (count() - uniqExact(id)).
#
# Measures, per system:
#   rows/s             rows landed / (all landed - first row consumed), wall
#                      clock. First row consumed: spate's
#                      spate_records_polled_total turning non-zero on /metrics;
#                      the Python loop's own timestamp; for the Kafka engine
#                      the later of its first partition assignment
#                      (librdkafka's debug log) and the start of its first
#                      background stream that committed rows (server log),
#                      else the first count() > 0 (noted). The group join
#                      (~3 s on the mock) is excluded for all.
#   consumer CPU       user+system CPU of the consumer process from its start
#                      to "all landed" (/proc/PID/stat), per million rows. The
#                      Kafka engine runs inside the server: see ClickHouse CPU.
#   ClickHouse CPU     the server's CPU delta over the same interval, per
#                      million rows (parsing the inserts, merges, and for the
#                      Kafka engine all of its consuming).
#   peak RSS           VmHWM of the consumer; the server's VmHWM after it was
#                      reset (/proc/PID/clear_refs) at the start of each run.
#   rows landed, dups  count() and count() - uniqExact(id) after the stop.
#
# Environment (defaults keep clear of ci/test.sh's ClickHouse ports):
#   SPATE_CH_DIR=/tmp/spate-ch-peer-bench  SPATE_CH_BASE_PORT=17123
#   PEER_BENCH_ADMIN_PORT=17190   spate's /metrics during its run
#   PEER_BENCH_TIMEOUT=300        seconds each system gets
#   PEER_BENCH_STALL=60           seconds without a new row = stalled
#   PEER_BENCH_KAFKA_CONSUMERS=2  kafka_num_consumers of the Kafka engine
#   PEER_BENCH_KAFKA_BLOCK=1048576 kafka_max_block_size of the Kafka engine
#   PEER_BENCH_PY_BATCH=100000    rows per Python insert
#   PEER_BENCH_SYSTEMS="spate spate-eo kafka python sinker"  which arms run
#   PEER_BENCH_REPS=3             repetitions (or --reps)
#   PEER_BENCH_SINKER_VERSION=v3.1.9  clickhouse_sinker version for go install
#   PEER_BENCH_SPATE_THREADS=2    spate's pipeline.threads
#   PEER_BENCH_PROFILE=0          1: after the measured runs, one more spate
#                                 run per workload under `perf record -F 999`
#                                 (not in the table): where spate's CPU goes,
#                                 by library and by function (self time), in
#                                 $CARGO_TARGET_DIR/peer-bench/profile-*.txt
#   PEER_BENCH_REPLICATED=1       0: a plain ClickHouse and MergeTree tables
#                                 (then the spate-eo arm cannot run: its
#                                 runs fail spate's own refusal)
#   --kafka real: SPATE_KAFKA_DIR=/tmp/spate-kafka-peer-bench
#   SPATE_KAFKA_BASE_PORT=17292 (clients 17292.., quorum 17392..)
#   PEER_BENCH_PARTITIONS=12
#
# Output: a Markdown table on stdout and in $CARGO_TARGET_DIR/peer-bench.md
# (medians [min-max] per arm), every run's measurements in
# $CARGO_TARGET_DIR/peer-bench/runs.tsv, logs of every process under
# $CARGO_TARGET_DIR/peer-bench/.
set -euo pipefail

KAFKA_KIND=real
ROWS=1000000
REPS="${PEER_BENCH_REPS:-3}"
WORKLOAD=all
usage() { echo "usage: $0 [--kafka real|mock] [--workload flights|sensor|all] [--reps N] [ROWS]" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --kafka) KAFKA_KIND="${2:-}"; shift 2 || usage ;;
    --workload) WORKLOAD="${2:-}"; shift 2 || usage ;;
    --reps) REPS="${2:-}"; shift 2 || usage ;;
    *) ROWS="$1"; shift ;;
  esac
done
[[ "$KAFKA_KIND" == mock || "$KAFKA_KIND" == real ]] || usage
[[ "$ROWS" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$WORKLOAD" == flights || "$WORKLOAD" == sensor || "$WORKLOAD" == all ]] || usage
want() { [[ "$WORKLOAD" == all || "$WORKLOAD" == "$1" ]]; }
want sensor && [[ "$KAFKA_KIND" != real ]] &&
  { echo "$0: the sensor workload runs on the real cluster only (--kafka real): 20,000 messages of ~4 KB outgrow the mock broker's 5 MiB-per-partition retention" >&2; exit 2; }
export SPATE_KAFKA_DIR="${SPATE_KAFKA_DIR:-/tmp/spate-kafka-peer-bench}"
export SPATE_KAFKA_BASE_PORT="${SPATE_KAFKA_BASE_PORT:-17292}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$REPO/target}"
export SPATE_CH_DIR="${SPATE_CH_DIR:-/tmp/spate-ch-peer-bench}"
export SPATE_CH_BASE_PORT="${SPATE_CH_BASE_PORT:-17123}"
ADMIN_PORT="${PEER_BENCH_ADMIN_PORT:-17190}"
TIMEOUT="${PEER_BENCH_TIMEOUT:-300}"
STALL="${PEER_BENCH_STALL:-60}"
KAFKA_CONSUMERS="${PEER_BENCH_KAFKA_CONSUMERS:-2}"
KAFKA_BLOCK="${PEER_BENCH_KAFKA_BLOCK:-1048576}"
PY_BATCH="${PEER_BENCH_PY_BATCH:-100000}"
SYSTEMS="${PEER_BENCH_SYSTEMS:-spate spate-eo kafka python sinker}"
SPATE_THREADS="${PEER_BENCH_SPATE_THREADS:-2}"
REPLICATED="${PEER_BENCH_REPLICATED:-1}"
SINKER_VERSION="${PEER_BENCH_SINKER_VERSION:-v3.1.9}"
PROFILE="${PEER_BENCH_PROFILE:-0}"
for a in $SYSTEMS; do
  case "$a" in spate | spate-eo | kafka | python | sinker) ;; *) echo "PEER_BENCH_SYSTEMS: unknown arm $a (known: spate spate-eo kafka python sinker)" >&2; exit 2 ;; esac
done
CONFLUENT_KAFKA="confluent-kafka==2.16.1"

WORK="$CARGO_TARGET_DIR/peer-bench"
VENV="$CARGO_TARGET_DIR/peer-bench-venv"
OUT="$CARGO_TARGET_DIR/peer-bench.md"
SPATE="$CARGO_TARGET_DIR/release/spate"
TOPIC=flights
RUN_ID="$(date +%s)"
TICKS="$(getconf CLK_TCK)"

log() { printf 'peer-bench: %s\n' "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

BROKER_PID=""
KAFKA_STARTED=""
CONSUMER_PID=""
CH_STARTED=""
cleanup() {
  local rc=$?
  if [[ -n "$CONSUMER_PID" ]] && kill -0 "$CONSUMER_PID" 2>/dev/null; then
    kill "$CONSUMER_PID" 2>/dev/null || true
    wait "$CONSUMER_PID" 2>/dev/null || true
  fi
  if [[ -n "$BROKER_PID" ]] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill "$BROKER_PID" 2>/dev/null || true
    wait "$BROKER_PID" 2>/dev/null || true
  fi
  if [[ -n "$KAFKA_STARTED" ]]; then
    bash ci/kafka.sh stop >/dev/null 2>&1 || true
  fi
  if [[ -n "$CH_STARTED" ]]; then
    # Keep the server's log (the Kafka engine's only account of itself).
    cp "$SPATE_CH_DIR/ch0/log/clickhouse-server.log" "$WORK/clickhouse-server.log" 2>/dev/null || true
    cp "$SPATE_CH_DIR/ch0/log/clickhouse-server.err.log" "$WORK/clickhouse-server.err.log" 2>/dev/null || true
    cp "$SPATE_CH_DIR/ch0/log/stdout.log" "$WORK/clickhouse-server.stdout.log" 2>/dev/null || true
    bash ci/clickhouse.sh stop >/dev/null 2>&1 || true
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Wall clock in seconds with microseconds, without a fork (bash 5).
now() { echo "$EPOCHREALTIME"; }
# calc EXPR: floating-point arithmetic.
calc() { awk "BEGIN { printf \"%s\", ($1) }"; }
# CPU seconds (user + system) of PID so far.
cpu_of() {
  local rest
  rest="$(sed 's/^.*) //' "/proc/$1/stat")"
  # After "pid (comm) ": state is field 1, utime 12, stime 13.
  awk -v t="$TICKS" '{ printf "%.3f", ($12 + $13) / t }' <<<"$rest"
}
# CPU seconds of PID's threads so far, summed by thread name with trailing
# digits and dashes dropped (spate-pipe-0 and -1 -> spate-pipe).
thread_cpu_of() {
  local f
  for f in /proc/"$1"/task/*/stat; do sed 's/^[0-9]* (\(.*\)) /\1 /' "$f"; done 2>/dev/null |
    awk -v t="$TICKS" '{ n = $1; sub(/[-0-9]+$/, "", n); c[n] += ($13 + $14) / t }
      END { for (n in c) if (c[n] >= 0.005) printf "%s %.2f\n", n, c[n] }' | sort -k2 -rn | paste -sd, | sed 's/,/, /g'
}
# Peak resident set size of PID in MiB (VmHWM).
hwm_of() { awk '/^VmHWM:/ { printf "%.0f", $2 / 1024 }' "/proc/$1/status"; }

# Profiling (PEER_BENCH_PROFILE=1): PROFILE_TO names the run being profiled.
# Such a run starts its arm under `perf record -F 999` (PROFILER; perf as the
# parent follows every thread from its birth, which `perf record -p` on a
# starting process does not), stop_arm signals the arm itself, and
# profile_stop writes the self time by library and by function to
# $PROFILE_TO.txt. It is never reported as a measurement (sampling costs the
# arm CPU, and the PID measured is perf's).
PROFILE_TO=""
PROFILER=()
profiler_for_run() {
  PROFILER=()
  [[ -z "$PROFILE_TO" ]] || PROFILER=(perf record -F 999 -o "$PROFILE_TO.data" --)
}
# stop_arm PID: SIGTERM to the arm (perf's child in a profiled run).
stop_arm() {
  if [[ -n "$PROFILE_TO" ]]; then pkill -TERM -P "$1" 2>/dev/null || true
  else kill -TERM "$1" 2>/dev/null || true; fi
}
profile_stop() {
  [[ -n "$PROFILE_TO" ]] || return 0
  {
    echo "# $1: perf record -F 999, the arm's whole run (start-up and the group join included)"
    echo "## self time by library"
    perf report -i "$PROFILE_TO.data" --stdio --no-children --sort dso --percent-limit 0.5 2>/dev/null | awk '!/^#/ && NF'
    echo "## self time by function (top 40)"
    # awk reads to the end: `head` would end the pipe in SIGPIPE, which
    # pipefail and errexit turn into the end of this script.
    perf report -i "$PROFILE_TO.data" --stdio --no-children --sort dso,sym 2>/dev/null | awk '!/^#/ && NF && n++ < 40'
    echo "## samples: $(perf report -i "$PROFILE_TO.data" --stdio 2>/dev/null | awk '/^# Samples:/ && !n++ { print $3 }') at 999 Hz"
  } >"$PROFILE_TO.txt" || true
  rm -f "$PROFILE_TO.data"
  log "profile written to $PROFILE_TO.txt"
}

ch() { curl -sS --fail-with-body "$CH_URL/" --data-binary "$1"; }
# count_of TABLE: its count(); with COUNT_METRIC set (an arm writing into
# the discarding endpoint), the arm's own count of rows acknowledged instead.
COUNT_METRIC=""
count_of() {
  if [[ -n "$COUNT_METRIC" ]]; then
    # Before the admin server listens curl fails: that is 0 rows, not the
    # end of this script (pipefail, errexit).
    { curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null || true; } |
      awk -v m="$COUNT_METRIC" 'index($0, m) == 1 && $1 !~ /^#/ { s += $NF } END { printf "%d\n", s }'
  else
    curl -sf "$CH_URL/" --data-binary "SELECT count() FROM $1" || echo 0
  fi
}

# --- 1. build and tools -------------------------------------------------------
apt_install() {
  log "installing $* (Debian packages)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
command -v curl >/dev/null || apt_install curl
[[ "$PROFILE" != 1 ]] || command -v perf >/dev/null || apt_install linux-perf
log "building spate (release)"
cargo build --release -p spate >&2
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV with $CONFLUENT_KAFKA"
  python3 -m venv "$VENV" 2>/dev/null || { rm -rf "$VENV"; apt_install python3-venv; python3 -m venv "$VENV"; }
fi
"$VENV/bin/python" -c 'import confluent_kafka' 2>/dev/null ||
  "$VENV/bin/pip" install -q "$CONFLUENT_KAFKA" >&2
PY="$VENV/bin/python"

rm -rf "$WORK"
mkdir -p "$WORK"
: >"$OUT"

# --- 2. rows ------------------------------------------------------------------
DATA="$WORK/flights.ndjson"
awk -v n="$ROWS" '
  /^\{/ { line[m++] = substr($0, 2) }
  END { for (i = 0; i < n; i++) printf "{\"id\":%d,%s\n", i, line[i % m] }
' engine/spate/fixtures/flights-20k.ndjson >"$DATA"
BYTES="$(stat -c %s "$DATA")"
# The mock cluster stores each message with its key and ~20 bytes of record
# overhead; keep every partition under 3 MiB of its 5 MiB retention.
PARTITIONS="$(calc "int(($BYTES + $ROWS * 32) / (3 * 1048576)) + 1")"
if ((PARTITIONS < 8)); then PARTITIONS=8; fi
log "$ROWS rows, $BYTES bytes of NDJSON, $PARTITIONS partitions"

# --- 3. broker, loaded once ---------------------------------------------------
if [[ "$KAFKA_KIND" == real ]]; then
PARTITIONS="${PEER_BENCH_PARTITIONS:-12}"
KAFKA_STARTED=1
BROKERS="$(bash ci/kafka.sh start 3 | tail -n1)" || die "ci/kafka.sh start failed"
"$PY" ci/peer_bench.py create-topic "$BROKERS" "$TOPIC" "$PARTITIONS" 3
BROKER_DESC="a real Apache Kafka 4.4.0 cluster (ci/kafka.sh: 3 KRaft nodes, $PARTITIONS partitions, replication factor 3, min.insync.replicas 2)"
else
BROKER_DESC="the embedded broker (librdkafka mock cluster, $PARTITIONS partitions)"
"$SPATE" broker --topic "$TOPIC" --partitions "$PARTITIONS" >"$WORK/broker.out" 2>"$WORK/broker.log" &
BROKER_PID=$!
for _ in $(seq 1 100); do
  [[ -s "$WORK/broker.out" ]] && break
  kill -0 "$BROKER_PID" 2>/dev/null || die "spate broker exited: $(cat "$WORK/broker.log")"
  sleep 0.1
done
BROKERS="$(head -n1 "$WORK/broker.out")"
[[ -n "$BROKERS" ]] || die "spate broker printed no address"
fi
if want flights; then
log "broker $BROKERS; producing"
"$SPATE" produce --brokers "$BROKERS" --topic "$TOPIC" "$DATA" >"$WORK/produce.out" 2>"$WORK/produce.log"
IN_TOPIC="$("$PY" ci/peer_bench.py watermarks "$BROKERS" "$TOPIC")"
[[ "$IN_TOPIC" == "$ROWS" ]] || die "the topic holds $IN_TOPIC messages, not $ROWS"
log "$IN_TOPIC messages in $TOPIC, every low watermark 0"
fi

# --- 4. ClickHouse --------------------------------------------------------------
# Trace logging and librdkafka's consumer-group debug log: the Kafka engine's
# only account of when it was assigned partitions, streamed and committed (and
# of why, when it does not) is the server's logs; Debian's config.xml logs
# warnings only. It costs the server a few lines per insert in every run
# alike, and a few per rebalance and heartbeat in the Kafka engine's run.
cat >"$WORK/kafka.xml" <<'EOF'
<yandex>
    <logger>
        <level>trace</level>
    </logger>
    <kafka>
        <auto_offset_reset>smallest</auto_offset_reset>
        <debug>cgrp</debug>
    </kafka>
</yandex>
EOF
CH_STARTED=1
if [[ "$REPLICATED" == 1 ]]; then
  CH_URL="$(SPATE_CH_EXTRA_CONFIG="$WORK/kafka.xml" bash ci/clickhouse.sh start-replicated 1 1 | head -n1)"
else
  CH_URL="$(SPATE_CH_EXTRA_CONFIG="$WORK/kafka.xml" bash ci/clickhouse.sh start 1 | head -n1)"
fi
CH_PID="$(cat "$SPATE_CH_DIR/ch0/pid")"
CH_LOG="$SPATE_CH_DIR/ch0/log/clickhouse-server.log"
CH_STDOUT="$SPATE_CH_DIR/ch0/log/stdout.log"
CH_VERSION="$(ch 'SELECT version()')"
log "ClickHouse $CH_VERSION at $CH_URL (pid $CH_PID)"

TABLE_DESC="MergeTree table"
[[ "$REPLICATED" == 1 ]] && TABLE_DESC="ReplicatedMergeTree table (one replica, replicated_deduplication_window = 10000)"
COLUMNS_DDL="id UInt64, date DateTime, delay Int32, distance UInt32, origin String, destination String"
fresh_table() {
  ch "DROP TABLE IF EXISTS $1" >/dev/null
  if [[ "$REPLICATED" == 1 ]]; then
    ch "CREATE TABLE $1 ($COLUMNS_DDL) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/$1_${RUN_ID}_${REP:-0}', '{replica}') ORDER BY id SETTINGS replicated_deduplication_window = 10000" >/dev/null
  else
    ch "CREATE TABLE $1 ($COLUMNS_DDL) ENGINE = MergeTree ORDER BY id" >/dev/null
  fi
}

# --- 5. measurements ------------------------------------------------------------
# report NAME TABLE CPU_CONSUMER RSS_CONSUMER CPU_SERVER RSS_SERVER NOTE: one
# line of $RUNS (TSV): arm, rep, gate (pass, or why not), landed, dups,
# wall s, rows/s, CPU s/M (arm, server), peak RSS MiB (arm, server), note.
RUNS="$WORK/runs.tsv"
report() {
  local name=$1 table=$2 cpu_c=$3 rss_c=$4 cpu_s=$5 rss_s=$6 note=$7
  local landed distinct dups wall rate first per_m_c per_m_s gate
  landed="$(count_of "$table")"
  distinct="$(ch "SELECT uniqExact(id) FROM $table")"
  dups=$((landed - distinct))
  first="${M_FIRST:-$M_FIRST_LANDED}"
  # The rate counts the rows landed when the watch ended (ROWS, or fewer
  # after a stall or timeout); "rows landed" is the count after the stop.
  if [[ -z "$first" ]] || (($(calc "$M_DONE <= $first"))) || ((M_LANDED == 0)); then
    wall="-"; rate="-"
  else
    wall="$(printf '%.2f' "$(calc "$M_DONE - $first")")"
    rate="$(calc "int($M_LANDED / ($M_DONE - $first))")"
  fi
  per_m() { if [[ "$1" == "-" ]] || ((distinct == 0)); then echo "-"; else printf '%.2f' "$(calc "$1 * 1000000 / $distinct")"; fi; }
  per_m_c="$(per_m "$cpu_c")"
  per_m_s="$(per_m "$cpu_s")"
  gate=pass
  if [[ "$M_STATUS" != complete ]]; then gate="$M_STATUS"
  elif ((distinct != ROWS)); then gate="lost $((ROWS - distinct)) rows"
  elif ((dups != 0)); then gate="$dups duplicate rows"
  elif [[ "$rate" == "-" ]]; then gate="no first-row time"
  fi
  [[ "$gate" == pass ]] || log "$name rep $REP: FAILED a gate: $gate"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$name" "$REP" "$gate" "$landed" "$dups" "$wall" "$rate" "$per_m_c" "$rss_c" "$per_m_s" "$rss_s" "$note" >>"$RUNS"
}
# not_run NAME WHY: an arm that could not run at all (every repetition).
not_run() {
  printf '%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t%s\n' "$1" "$REP" "not run: $2" "$2" >>"$RUNS"
}

# measure NAME TABLE CONSUMER_PID FIRST_ROW_CMD: poll until ROWS landed, the
# timeout, or a stall; sets M_* for report().
measure() {
  local name=$1 table=$2 pid=$3 first_cmd=$4
  local t n last_n=-1
  M_FIRST=""
  M_FIRST_LANDED=""
  M_DONE=""
  M_STATUS="complete"
  M_LANDED=0
  local deadline=$((SECONDS + TIMEOUT)) stall_at=$((SECONDS + STALL))
  while :; do
    t="$EPOCHREALTIME"
    if [[ -z "$M_FIRST" ]]; then
      M_FIRST="$(eval "$first_cmd" || true)"
    fi
    n="$(count_of "$table")"
    if [[ -z "$M_FIRST_LANDED" ]] && ((n > 0)); then M_FIRST_LANDED="$t"; fi
    M_LANDED=$n
    if ((n >= ROWS)); then M_DONE="$t"; break; fi
    if ((n != last_n)); then last_n=$n; stall_at=$((SECONDS + STALL)); fi
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      M_STATUS="consumer exited after $n rows"; M_DONE="$t"; break
    fi
    if ((SECONDS > deadline)); then
      M_STATUS="timed out after ${TIMEOUT}s with $n rows"; M_DONE="$t"; break
    fi
    if ((SECONDS > stall_at)); then
      M_STATUS="stalled at $n rows (no new row for ${STALL}s)"; M_DONE="$t"; break
    fi
    # 100 ms: fine enough for runs of seconds, light on a 2-core machine.
    sleep 0.1
  done
  log "$name: $M_STATUS"
}

check_retention() {
  local n
  n="$("$PY" ci/peer_bench.py watermarks "$BROKERS" "$TOPIC")" || die "broker retention deleted data before $1"
  [[ "$n" == "$ROWS" ]] || die "the topic holds $n messages before $1, not $ROWS"
}

server_cpu() { cpu_of "$CH_PID"; }
reset_server_hwm() { echo 5 >"/proc/$CH_PID/clear_refs" 2>/dev/null || log "cannot reset the server's VmHWM; its peak RSS includes earlier runs"; }

# --- arms: each runs once for repetition $REP -------------------------------------
arm_spate() {
  local name=$1 delivery=$2 table=$3
  check_retention "$name"
  fresh_table "$table"
  local DELIVERY_KEY=""
  [[ "$delivery" == at_least_once ]] || DELIVERY_KEY=", delivery: $delivery"
  cat >"$WORK/$table-$REP.yaml" <<EOF
pipeline: { name: "peer-bench-$RUN_ID", threads: $SPATE_THREADS, io_threads: 2$DELIVERY_KEY }
checkpoint: { interval: 200ms }
source:
  kafka:
    brokers: "$BROKERS"
    topics: [$TOPIC]
    group_id: "peer-$table-$RUN_ID-$REP"
    properties: { session.timeout.ms: "6000", heartbeat.interval.ms: "500" }
format: { json: { time_formats: ["%Y/%m/%d %H:%M"] } }
on_error: { policy: fail }
sink:
  clickhouse:
    shards: [["$CH_URL"]]
    table: $table
    batch: { max_rows: 1000000, max_bytes: 64MiB, linger: 200ms }
    inflight: { max_inflight: 2, max_bytes: 256MiB }
shutdown: { drain_timeout: 30s }
admin: { listen: "127.0.0.1:$ADMIN_PORT" }
EOF
  log "$name rep $REP: running"
  reset_server_hwm
  s_cpu0="$(server_cpu)"
  profiler_for_run
  "${PROFILER[@]}" "$SPATE" run -c "$WORK/$table-$REP.yaml" >"$WORK/$table-$REP.out" 2>"$WORK/$table-$REP.log" &
  CONSUMER_PID=$!
  spate_first() {
    local polled
    polled="$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null |
      awk '/^spate_records_polled_total/ { s += $NF } END { print s + 0 }')"
    ((polled > 0)) && now
  }
  measure "$name" "$table" "$CONSUMER_PID" spate_first
  c_cpu="$(cpu_of "$CONSUMER_PID")"; c_rss="$(hwm_of "$CONSUMER_PID")"
  c_threads="$(thread_cpu_of "$CONSUMER_PID")"
  # Inserts made (batches flushed) while the rows landed, per second.
  inserts="$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null |
    awk '/^spate_sink_batches_flushed_total/ { s += $NF } END { print s + 0 }')"
  ins_rate="-"
  if [[ -n "${M_FIRST:-}" && -n "$M_DONE" ]] && (($(calc "$M_DONE > $M_FIRST"))); then
    ins_rate="$(printf '%.1f' "$(calc "$inserts / ($M_DONE - $M_FIRST)")")"
  fi
  s_cpu="$(calc "$(server_cpu) - $s_cpu0")"; s_rss="$(hwm_of "$CH_PID")"
  stop_arm "$CONSUMER_PID"
  spate_rc=0; wait "$CONSUMER_PID" || spate_rc=$?
  CONSUMER_PID=""
  profile_stop "$name, flights, $ROWS rows"
  note="delivery $delivery; format native (default); $inserts inserts ($ins_rate/s); threads $SPATE_THREADS, io_threads 2, batch max_rows 1M / 64 MiB / linger 200ms, max_inflight 2; CPU s by thread (whole run): $c_threads; exit $spate_rc after SIGTERM"
  [[ -z "$PROFILE_TO" ]] || return 0
  report "$name" "$table" "$c_cpu" "$c_rss" "$s_cpu" "$s_rss" "$note"
}

arm_kafka() {
  check_retention "the Kafka engine"
  fresh_table peer_kafka
  ch "DROP TABLE IF EXISTS peer_kafka_mv" >/dev/null
  ch "DROP TABLE IF EXISTS peer_kafka_queue" >/dev/null
  # The queue reads the date as String (JSONEachRow in 18.16 parses DateTime
  # only as YYYY-MM-DD hh:mm:ss); the view converts it.
  KAFKA_SETTINGS="kafka_broker_list = '$BROKERS', kafka_topic_list = '$TOPIC', kafka_group_name = 'peer-ch-kafka-$RUN_ID-$REP', kafka_format = 'JSONEachRow', kafka_num_consumers = $KAFKA_CONSUMERS, kafka_max_block_size = $KAFKA_BLOCK"
  ch "CREATE TABLE peer_kafka_queue (id UInt64, date String, delay Int32, distance UInt32, origin String, destination String) ENGINE = Kafka SETTINGS $KAFKA_SETTINGS" >/dev/null
  log_lines_before="$(wc -l <"$CH_LOG")"
  log "Kafka engine rep $REP: running ($KAFKA_SETTINGS)"
  reset_server_hwm
  s_cpu0="$(server_cpu)"
  ch "CREATE MATERIALIZED VIEW peer_kafka_mv TO peer_kafka AS SELECT id, parseDateTimeBestEffort(date) AS date, delay, distance, origin, destination FROM peer_kafka_queue" >/dev/null
  measure "ClickHouse Kafka engine" peer_kafka "" false
  s_cpu="$(calc "$(server_cpu) - $s_cpu0")"; s_rss="$(hwm_of "$CH_PID")"
  # The engine logs no line per poll. Two lower bounds on its first consumed
  # row, the later of which is taken (it errs early, against the engine):
  # - the start of its first background stream that committed rows: each
  #   stream logs "Started streaming" when it starts and "Committing N
  #   messages" when it ends (server log; the commit comes at the end of the
  #   stream, so wait for it before dropping the view);
  # - its consumers' first partition assignment, from librdkafka's own
  #   debug=cgrp log on the server's stderr (epoch seconds in the second
  #   |-field): a stream that starts before the group join blocks through it.
  # (awk reads the file itself: `tail | awk '...exit'` would end in SIGPIPE,
  # which pipefail and errexit turn into the end of this script.)
  kafka_stream_start() {
    awk -v skip="$log_lines_before" '
      NR <= skip || !/StorageKafka \(peer_kafka_queue\)/ { next }
      /Started streaming/ { last = $1 " " $2 }
      /Committing [1-9][0-9]* messages/ { print last; exit }' "$CH_LOG"
  }
  for _ in $(seq 1 150); do
    [[ -n "$(kafka_stream_start)" ]] && break
    sleep 0.1
  done
  stream_start="$(kafka_stream_start)"
  assigned="$(grep -m1 -a "assigned topic $TOPIC partitions" "$CH_STDOUT" | cut -d'|' -f2 || true)"
  if [[ -n "$stream_start" ]]; then
    # "2026.11.29 18:40:01.123456": the server's local time, as date(1)'s.
    d="${stream_start%% *}"
    M_FIRST="$(date -d "${d//./-} ${stream_start#* }" +%s.%N)"
    if [[ -n "$assigned" ]] && (($(calc "$assigned > $M_FIRST"))); then
      M_FIRST="$assigned"
    fi
  fi
  ch "DROP TABLE peer_kafka_mv" >/dev/null
  ch "DROP TABLE peer_kafka_queue" >/dev/null
  KAFKA_REASON=""
  if [[ "$M_STATUS" != complete ]]; then
    KAFKA_REASON="$(awk -v skip="$log_lines_before" 'NR > skip' "$CH_LOG" | grep -E '<(Error|Warning)>|Exception' | grep -iE 'kafka|rdk' | tail -n 3 | cut -c1-300 || true)"
    printf '%s\n' "$KAFKA_REASON" >"$WORK/kafka-engine-errors.log"
  fi
  # Rebalances of the engine's group (librdkafka's cgrp log): a partition
  # left unassigned after one is a way for the engine to stall short of ROWS.
  rebalances="$(grep -a -c 'initiating rebalance' "$CH_STDOUT" || true)"
  if [[ -n "$M_FIRST" ]]; then
    first_note="first row: the later of its first partition assignment (librdkafka debug log) and the start of its first stream that committed rows (server log)"
  else
    first_note="first row: first count() > 0 (no committed stream in the server log)"
  fi
  note="kafka_num_consumers $KAFKA_CONSUMERS, kafka_max_block_size $KAFKA_BLOCK, stream_flush_interval_ms 7500 (default); server librdkafka $(dpkg-query -W -f '${Version}' librdkafka1 2>/dev/null || echo unknown); $first_note; CPU and RSS are the server's"
  note="$note; librdkafka log: ${rebalances:-0} rebalance starts over its $KAFKA_CONSUMERS consumer(s) (the first join counts one each)"
  [[ -n "$KAFKA_REASON" ]] && note="$note; server log: $(tr '\n|' '  ' <<<"$KAFKA_REASON")"
  report "ClickHouse Kafka engine + MV" peer_kafka "-" "(in server)" "$s_cpu" "$s_rss" "$note"
}

arm_python() {
  check_retention "the Python loop"
  fresh_table peer_python
  log "Python loop rep $REP: running"
  reset_server_hwm
  s_cpu0="$(server_cpu)"
  "$PY" ci/peer_bench.py consume "$BROKERS" "$TOPIC" "peer-python-$RUN_ID-$REP" "$CH_URL" peer_python "$PY_BATCH" "$WORK/python-$REP.first" \
    >"$WORK/python-$REP.out" 2>"$WORK/python-$REP.log" &
  CONSUMER_PID=$!
  python_first() { [[ -s "$WORK/python-$REP.first" ]] && cat "$WORK/python-$REP.first"; }
  measure "Python loop" peer_python "$CONSUMER_PID" python_first
  c_cpu="$(cpu_of "$CONSUMER_PID" 2>/dev/null || echo -)"; c_rss="$(hwm_of "$CONSUMER_PID" 2>/dev/null || echo -)"
  s_cpu="$(calc "$(server_cpu) - $s_cpu0")"; s_rss="$(hwm_of "$CH_PID")"
  kill -TERM "$CONSUMER_PID" 2>/dev/null || true
  py_rc=0; wait "$CONSUMER_PID" || py_rc=$?
  CONSUMER_PID=""
  note="confluent-kafka $("$PY" -c 'import importlib.metadata as m, confluent_kafka as c; print(m.version("confluent-kafka"), "(librdkafka", c.libversion()[0] + ")")'), $PY_BATCH-row JSONEachRow HTTP inserts, sync commit after each; exit $py_rc"
  report "Python loop (confluent-kafka)" peer_python "$c_cpu" "$c_rss" "$s_cpu" "$s_rss" "$note"
}

arm_sinker() {
  # clickhouse_sinker (Go), built once with the ordinary Go tooling.
  if [[ -z "${SINKER_BIN:-}" ]]; then
    SINKER_GOBIN="$CARGO_TARGET_DIR/peer-bench-go/bin"
    mkdir -p "$SINKER_GOBIN"
    if GOBIN="$SINKER_GOBIN" go install "github.com/housepower/clickhouse_sinker/cmd/clickhouse_sinker@$SINKER_VERSION" >"$WORK/sinker-install.log" 2>&1; then
      SINKER_BIN="$SINKER_GOBIN/clickhouse_sinker"
    else
      SINKER_BIN="unavailable"
      SINKER_WHY="go install ...clickhouse_sinker@$SINKER_VERSION failed: $(grep -v '^\s*$' "$WORK/sinker-install.log" | head -n 2 | tr '\n\t|' '   ')"
      log "clickhouse_sinker: $SINKER_WHY"
    fi
  fi
  if [[ "$SINKER_BIN" == unavailable ]]; then
    not_run "clickhouse_sinker" "$SINKER_WHY"
    return 0
  fi
  not_run "clickhouse_sinker" "built at $SINKER_BIN, but this script has no configuration for it yet"
}

# --- repetitions, interleaved ------------------------------------------------------
if want flights; then
read -r -a ARMS <<<"$SYSTEMS"
: >"$RUNS"
for ((REP = 1; REP <= REPS; REP++)); do
  n=${#ARMS[@]}
  for ((k = 0; k < n; k++)); do
    arm="${ARMS[$(((k + REP - 1) % n))]}"
    case "$arm" in
      spate) arm_spate spate at_least_once peer_spate ;;
      spate-eo) arm_spate "spate (effectively_once)" effectively_once peer_spate_eo ;;
      kafka) arm_kafka ;;
      python) arm_python ;;
      sinker) arm_sinker ;;
    esac
  done
done

if [[ "$PROFILE" == 1 ]]; then
  REP=profile PROFILE_TO="$WORK/profile-flights-spate"
  arm_spate spate at_least_once peer_spate
  PROFILE_TO=""
fi

# Retention must still be intact: otherwise a short count could be the broker's.
check_retention "the end"

# --- 6. table -------------------------------------------------------------------
{
  echo "$ROWS flight rows ($BYTES bytes NDJSON) pre-loaded once into $BROKER_DESC (every low watermark checked 0 before each run), then moved into ClickHouse $CH_VERSION on the same machine ($(nproc) cores, $(awk '/^model name/ { $1=$2=$3=""; print; exit }' /proc/cpuinfo | sed 's/^ *//')), one arm at a time, $REPS repetitions interleaved, each run in its own consumer group and into a fresh $TABLE_DESC. Medians over the runs that passed the gates, [min-max] beside them. Command: \`PEER_BENCH_REPLICATED=$REPLICATED bash ci/peer-bench.sh --kafka $KAFKA_KIND --reps $REPS $ROWS\`."
  echo
  "$PY" ci/peer_bench.py summarize "$RUNS" "$REPS"
} | tee -a "$OUT"
log "table written to $OUT; every run in $RUNS"
fi

# --- 7. the sensor workload (issue 21's SensorBatch; the upstream project's own) ---
# PEER_BENCH_SENSOR_MESSAGES (default 20,000) messages of 100 events each,
# Confluent-framed Avro with the writer schema in the schema registry
# (ci/registry.sh: a test fixture serving the Confluent REST subset; no real
# registry runs here, see its header), produced once by `spate produce
# --sensor` into a topic of $PARTITIONS partitions on the real cluster.
# Each arm fans every message out into 100 rows, keeps the rows with
# unit != "drop" and value >= 0, coalesces a null region to 'unknown', and
# the table computes name_upper and value_scaled (MATERIALIZED) for every
# arm alike. Gates: the kept rows' count, uniqExact((batch_id, event_seq)),
# sum(value), sum(value_scaled), the null pattern and sum of quality, the
# regions coalesced, and a checksum of name_upper, each equal to the closed
# form from the generator's formulas (ci/peer_bench.py sensor-expect).
#
# Where each arm writes: upstream spate 0.2.0 always sends
# insert_deduplication_token, which ClickHouse 18.16 refuses (measured:
# "Code: 115, Unknown setting insert_deduplication_token"), so its arms and
# a spate arm beside them write into the current engine behind
# ci/chdb_server.py (chdb-core 26.9; the HTTP layer is ours and serializes
# inserts through one lock, so its "server" CPU includes Python's); one more
# spate arm writes into 18.16. The arms' own CPU per row is the comparison
# that holds across both. The spate-discard and upstream-discard arms write
# into a second endpoint started with --discard-inserts (every INSERT
# checked against the table, its body read, then answered unexecuted): the
# arms' own CPU per row with the server's cost per insert taken away, in a
# table of their own (nothing lands there, so "loss, dups" is not measured;
# the gates are the arm's count of rows acknowledged and the endpoint's
# answer to every insert).
if want sensor; then
SENSOR_MESSAGES="${PEER_BENCH_SENSOR_MESSAGES:-20000}"
SENSOR_TOPIC=sensors
SENSOR_SYSTEMS="${PEER_BENCH_SENSOR_SYSTEMS:-spate spate-chdb upstream upstream-native spate-discard upstream-discard}"
REGISTRY_PORT="${PEER_BENCH_REGISTRY_PORT:-17181}"
UPSTREAM_DIR="benches/peers/upstream-spate"
UPSTREAM="$CARGO_TARGET_DIR/upstream-spate/release/upstream-spate-arm"
log "building the upstream spate 0.2.0 arm (release, its own Cargo project and lockfile)"
CARGO_TARGET_DIR="$CARGO_TARGET_DIR/upstream-spate" cargo build --release --locked --manifest-path "$UPSTREAM_DIR/Cargo.toml" >&2

export SPATE_REGISTRY_DIR="$WORK/registry" SPATE_REGISTRY_PORT="$REGISTRY_PORT"
REGISTRY_URL="$(bash ci/registry.sh start | tail -n1)" || die "ci/registry.sh start failed"
REGISTRY_STARTED=1
trap 'bash ci/registry.sh stop >/dev/null 2>&1 || true; kill "${CHDB_PID:-}" "${DISCARD_PID:-}" 2>/dev/null || true; cleanup' EXIT

"$PY" ci/peer_bench.py create-topic "$BROKERS" "$SENSOR_TOPIC" "$PARTITIONS" 3
log "producing $SENSOR_MESSAGES SensorBatch messages (registry $REGISTRY_URL)"
"$SPATE" produce --brokers "$BROKERS" --topic "$SENSOR_TOPIC" --sensor "$SENSOR_MESSAGES" --registry "$REGISTRY_URL" \
  >"$WORK/produce-sensor.out" 2>"$WORK/produce-sensor.log" || die "spate produce --sensor: $(tail -n 3 "$WORK/produce-sensor.log")"
n="$("$PY" ci/peer_bench.py watermarks "$BROKERS" "$SENSOR_TOPIC")"
[[ "$n" == "$SENSOR_MESSAGES" ]] || die "the sensor topic holds $n messages, not $SENSOR_MESSAGES"
EXP_KEPT="$("$PY" ci/peer_bench.py sensor-expect "$SENSOR_MESSAGES")"
log "$SENSOR_MESSAGES messages -> $((SENSOR_MESSAGES * 100)) candidate rows, $EXP_KEPT kept (closed form)"

# The current engine behind our HTTP layer (chdb-core; first run installs it).
export SPATE_CHDB_VENV="${SPATE_CHDB_VENV:-$CARGO_TARGET_DIR/chdb/venv}"
python3 ci/chdb_server.py --port 0 --data "$WORK/chdb-data" >"$WORK/chdb.urls" 2>"$WORK/chdb.log" &
CHDB_PID=$!
for _ in $(seq 1 1200); do
  [[ -s "$WORK/chdb.urls" ]] && break
  kill -0 "$CHDB_PID" 2>/dev/null || die "ci/chdb_server.py exited: $(tail -n 5 "$WORK/chdb.log")"
  sleep 0.5
done
CHDB_URL="$(head -n1 "$WORK/chdb.urls")"
[[ -n "$CHDB_URL" ]] || die "ci/chdb_server.py did not answer in 10 minutes"
# The same endpoint answering INSERTs without executing them: each arm's own
# CPU per row with the server's cost per insert taken away.
python3 ci/chdb_server.py --port 0 --data "$WORK/chdb-discard-data" --discard-inserts >"$WORK/chdb-discard.urls" 2>"$WORK/chdb-discard.log" &
DISCARD_PID=$!
for _ in $(seq 1 600); do
  [[ -s "$WORK/chdb-discard.urls" ]] && break
  kill -0 "$DISCARD_PID" 2>/dev/null || die "ci/chdb_server.py --discard-inserts exited: $(tail -n 5 "$WORK/chdb-discard.log")"
  sleep 0.5
done
DISCARD_URL="$(head -n1 "$WORK/chdb-discard.urls")"
[[ -n "$DISCARD_URL" ]] || die "ci/chdb_server.py --discard-inserts did not answer"
CH18_URL="$CH_URL"
CHDB_VERSION="$(curl -sS "$CHDB_URL/" --data-binary 'SELECT version()')"
log "chdb endpoint $CHDB_URL (engine $CHDB_VERSION)"

SENSOR_DDL="batch_id UInt64, source String, region String, produced_at UInt64, event_seq UInt32, sensor_id UInt32, name String, value Float64, quality Nullable(Int32), unit String, ts UInt64, name_upper String MATERIALIZED upper(name), value_scaled Float64 MATERIALIZED value * 10"
SENSOR_COLUMNS="batch_id, source, region, produced_at, event_seq, sensor_id, name, value, quality, unit, ts"
sensor_table() { # URL TABLE
  curl -sS --fail-with-body "$1/" --data-binary "DROP TABLE IF EXISTS $2" >/dev/null
  curl -sS --fail-with-body "$1/" --data-binary "CREATE TABLE $2 ($SENSOR_DDL) ENGINE = MergeTree ORDER BY (batch_id, event_seq)" >/dev/null
}
SENSOR_CHECK_SQL="count(), uniqExact(batch_id, event_seq), sum(value), sum(value_scaled), countIf(isNull(quality)), sum(ifNull(quality, 0)), countIf(region = 'unknown'), sum(toUInt64(substring(name_upper, 8))), countIf(substring(name_upper, 1, 7) = 'SENSOR-')"
RUNS_SENSOR="$WORK/runs-sensor.tsv"
RUNS_DISCARD="$WORK/runs-discard.tsv"
: >"$RUNS_SENSOR"
: >"$RUNS_DISCARD"

# report_discard NAME TABLE CPU_ARM RSS_ARM CPU_SERVER RSS_SERVER NOTE: a run
# into the discarding endpoint. Nothing lands, so its gates are the arm's own
# count of rows acknowledged (exactly the kept rows, M_LANDED read before the
# stop) and the endpoint's account of every insert it answered (no error).
report_discard() {
  local name=$1 table=$2 cpu_c=$3 rss_c=$4 cpu_s=$5 rss_s=$6 note=$7
  local first wall rate gate inserts errors
  first="${M_FIRST:-}"
  if [[ -z "$first" ]] || (($(calc "$M_DONE <= $first"))) || ((M_LANDED == 0)); then wall="-"; rate="-"
  else wall="$(printf '%.2f' "$(calc "$M_DONE - $first")")"; rate="$(calc "int($M_LANDED / ($M_DONE - $first))")"; fi
  per_m() { if [[ "$1" == "-" ]]; then echo "-"; else printf '%.2f' "$(calc "$1 * 1000000 / $EXP_KEPT")"; fi; }
  inserts="$(curl -s "$DISCARD_URL/_chdb/inserts" | grep -c "\"table\": \"default.$table\"" || true)"
  errors="$(curl -s "$DISCARD_URL/_chdb/inserts" | grep "\"table\": \"default.$table\"" | grep -vc '"outcome": "discarded"' || true)"
  gate=pass
  if [[ "$M_STATUS" != complete ]]; then gate="$M_STATUS"
  elif ((M_LANDED != EXP_KEPT)); then gate="acknowledged $M_LANDED rows, expected $EXP_KEPT"
  elif ((errors != 0)); then gate="$errors inserts refused by the endpoint"
  elif [[ "$rate" == "-" ]]; then gate="no first-row time"
  fi
  [[ "$gate" == pass ]] || log "$name rep $REP: FAILED a gate: $gate"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$name" "$REP" "$gate" "$M_LANDED" "-" "$wall" "$rate" "$(per_m "$cpu_c")" "$rss_c" "$(per_m "$cpu_s")" "$rss_s" "$note; $inserts inserts discarded" >>"$RUNS_DISCARD"
}

# report_sensor NAME URL TABLE CPU_ARM RSS_ARM CPU_SERVER RSS_SERVER NOTE
report_sensor() {
  local name=$1 url=$2 table=$3 cpu_c=$4 rss_c=$5 cpu_s=$6 rss_s=$7 note=$8
  local got landed distinct dups first wall rate gate check
  got="$(curl -sS "$url/" --data-binary "SELECT $SENSOR_CHECK_SQL FROM $table FORMAT TSV" | tr '\t' ' ')"
  read -r landed distinct _ <<<"$got"
  dups=$((landed - distinct))
  first="${M_FIRST:-$M_FIRST_LANDED}"
  if [[ -z "$first" ]] || (($(calc "$M_DONE <= $first"))) || ((M_LANDED == 0)); then wall="-"; rate="-"
  else wall="$(printf '%.2f' "$(calc "$M_DONE - $first")")"; rate="$(calc "int($M_LANDED / ($M_DONE - $first))")"; fi
  per_m() { if [[ "$1" == "-" ]] || ((distinct == 0)); then echo "-"; else printf '%.2f' "$(calc "$1 * 1000000 / $distinct")"; fi; }
  gate=pass
  if [[ "$M_STATUS" != complete ]]; then gate="$M_STATUS"
  elif ((distinct != EXP_KEPT)); then gate="kept $distinct distinct rows, expected $EXP_KEPT"
  elif ((dups != 0)); then gate="$dups duplicate rows"
  elif ! check="$("$PY" ci/peer_bench.py sensor-check "$SENSOR_MESSAGES" $got)"; then gate="$check"
  elif [[ "$rate" == "-" ]]; then gate="no first-row time"
  fi
  [[ "$gate" == pass ]] || log "$name rep $REP: FAILED a gate: $gate"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' \
    "$name" "$REP" "$gate" "$landed" "$dups" "$wall" "$rate" "$(per_m "$cpu_c")" "$rss_c" "$(per_m "$cpu_s")" "$rss_s" "$note" >>"$RUNS_SENSOR"
}

# first_by_metric NAME: the time the arm's /metrics first shows a non-zero NAME.
first_by_metric() {
  local v
  v="$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" 2>/dev/null | awk -v m="$1" 'index($0, m) == 1 { s += $NF } END { print s + 0 }')"
  (($(calc "$v > 0"))) && now
}

# sensor_arm NAME KIND URL SERVER_PID ARM: KIND spate | upstream |
# upstream-native; ARM (the PEER_BENCH_SENSOR_SYSTEMS name) names the table
# and the consumer group, so two arms of one KIND never share a group's
# committed offsets.
sensor_arm() {
  local name=$1 kind=$2 url=$3 spid=$4 arm=$5 table yaml cpu0 c_cpu c_rss s_cpu s_rss rc note metric
  table="sensor_${arm//-/_}_$REP"
  yaml="$WORK/$table.yaml"
  sensor_table "$url" "$table"
  local group="peer-$table-$RUN_ID"
  if [[ "$kind" == spate ]]; then
    cat >"$yaml" <<EOF
pipeline: { name: "peer-sensor-$RUN_ID", threads: $SPATE_THREADS, io_threads: 2 }
checkpoint: { interval: 200ms }
source:
  kafka:
    brokers: "$BROKERS"
    topics: [$SENSOR_TOPIC]
    group_id: "$group"
    properties: { session.timeout.ms: "6000", heartbeat.interval.ms: "500" }
format: { avro: { framing: confluent, registry: { url: "$REGISTRY_URL" } } }
mapping:
  explode: /events
  filter: ['unit != "drop"', 'value >= 0']
  defaults: { region: unknown }
on_error: { policy: fail }
sink:
  clickhouse:
    shards: [["$url"]]
    table: $table
    batch: { max_rows: 1000000, max_bytes: 64MiB, linger: 200ms }
    inflight: { max_inflight: 2, max_bytes: 256MiB }
shutdown: { drain_timeout: 30s }
admin: { listen: "127.0.0.1:$ADMIN_PORT" }
EOF
    metric=spate_records_polled_total
    note="spate, format native (its default: typed blocks transcoded from the RowBinary rows), threads $SPATE_THREADS, batch max_rows 1M / 64 MiB / linger 200ms"
  else
    cat >"$yaml" <<EOF
pipeline: { name: "peer-upstream-$RUN_ID", threads: $SPATE_THREADS, io_threads: 2 }
checkpoint: { interval: 1s, drain_timeout: 30s }
admin: { listen: "127.0.0.1:$ADMIN_PORT" }
metrics: { exporter: prometheus }
source:
  kafka:
    brokers: "$BROKERS"
    topic: $SENSOR_TOPIC
    group_id: "$group"
    commit_interval: 1s
    rdkafka: { auto.offset.reset: earliest }
deserializer:
  avro:
    mode: confluent
    registry: { url: "$REGISTRY_URL" }
sink:
  clickhouse:
    table: $table
    columns: [$SENSOR_COLUMNS]
    format: $([[ "$kind" == upstream-native ]] && echo native || echo rowbinary)
    compression: none
    shards:
      - replicas: ["$url"]
    batch: { max_rows: 1000000, max_bytes: 64MiB, linger: 200ms }
    inflight: { max_per_shard: 2 }
EOF
    metric=spate_deser_records_total
    note="upstream spate 0.2.0 ($([[ "$kind" == upstream-native ]] && echo Native || echo RowBinary)), build_datum into borrowed records, flat_map, filter, threads $SPATE_THREADS, batch max_rows 1M / 64 MiB / linger 200ms, 2 inserts in flight"
  fi
  log "$name rep $REP: running"
  cpu0="$(cpu_of "$spid")"
  local save_url="$CH_URL" save_rows="$ROWS"
  CH_URL="$url"; ROWS="$EXP_KEPT"
  if [[ "$url" == "$DISCARD_URL" ]]; then
    if [[ "$kind" == spate ]]; then COUNT_METRIC=spate_sink_rows_written_total; else COUNT_METRIC=spate_sink_records_total; fi
  fi
  profiler_for_run
  if [[ "$kind" == spate ]]; then
    "${PROFILER[@]}" "$SPATE" run -c "$yaml" >"$WORK/$table.out" 2>"$WORK/$table.log" &
  else
    SPATE_CONFIG="$yaml" UPSTREAM_FORMAT="$([[ "$kind" == upstream-native ]] && echo native || echo rowbinary)" \
      "${PROFILER[@]}" "$UPSTREAM" >"$WORK/$table.out" 2>"$WORK/$table.log" &
  fi
  CONSUMER_PID=$!
  measure "$name" "$table" "$CONSUMER_PID" "first_by_metric $metric"
  COUNT_METRIC=""
  CH_URL="$save_url"; ROWS="$save_rows"
  c_cpu="$(cpu_of "$CONSUMER_PID" 2>/dev/null || echo -)"; c_rss="$(hwm_of "$CONSUMER_PID" 2>/dev/null || echo -)"
  s_cpu="$(calc "$(cpu_of "$spid") - $cpu0")"; s_rss="$(hwm_of "$spid")"
  stop_arm "$CONSUMER_PID"
  rc=0; wait "$CONSUMER_PID" || rc=$?
  CONSUMER_PID=""
  profile_stop "$name, sensor, $EXP_KEPT kept rows"
  if [[ "$url" == "$DISCARD_URL" ]]; then
    [[ -n "$PROFILE_TO" ]] || report_discard "$name" "$table" "$c_cpu" "$c_rss" "$s_cpu" "$s_rss" "$note; exit $rc after SIGTERM"
    return 0
  fi
  if [[ "$url" == "$CHDB_URL" ]]; then
    # The endpoint pays per insert (one lock, a temp file, a query each):
    # how many inserts an arm made says what its rows/s there is bound by.
    note="$note; $(curl -s "$CHDB_URL/_chdb/inserts" | grep -c "\"table\": \"default.$table\"" || true) inserts"
  fi
  if [[ "$M_STATUS" != complete ]]; then
    note="$note; last log lines: $(tail -n 2 "$WORK/$table.log" | cut -c1-240 | tr '\n|' '  ')"
  fi
  [[ -z "$PROFILE_TO" ]] || return 0
  report_sensor "$name" "$url" "$table" "$c_cpu" "$c_rss" "$s_cpu" "$s_rss" "$note; exit $rc after SIGTERM"
}

read -r -a SARMS <<<"$SENSOR_SYSTEMS"
for ((REP = 1; REP <= REPS; REP++)); do
  n=${#SARMS[@]}
  for ((k = 0; k < n; k++)); do
    arm="${SARMS[$(((k + REP - 1) % n))]}"
    case "$arm" in
      spate) sensor_arm "spate -> ClickHouse 18.16" spate "$CH18_URL" "$CH_PID" "$arm" ;;
      spate-chdb) sensor_arm "spate -> chdb endpoint" spate "$CHDB_URL" "$CHDB_PID" "$arm" ;;
      upstream) sensor_arm "upstream spate 0.2.0 (RowBinary) -> chdb endpoint" upstream "$CHDB_URL" "$CHDB_PID" "$arm" ;;
      upstream-native) sensor_arm "upstream spate 0.2.0 (Native) -> chdb endpoint" upstream-native "$CHDB_URL" "$CHDB_PID" "$arm" ;;
      spate-discard) sensor_arm "spate -> discarding endpoint" spate "$DISCARD_URL" "$DISCARD_PID" "$arm" ;;
      upstream-discard) sensor_arm "upstream spate 0.2.0 (RowBinary) -> discarding endpoint" upstream "$DISCARD_URL" "$DISCARD_PID" "$arm" ;;
      *) die "PEER_BENCH_SENSOR_SYSTEMS: unknown arm $arm (known: spate spate-chdb upstream upstream-native spate-discard upstream-discard)" ;;
    esac
  done
done
if [[ "$PROFILE" == 1 ]]; then
  REP=profile PROFILE_TO="$WORK/profile-sensor-spate"
  sensor_arm "spate -> ClickHouse 18.16" spate "$CH18_URL" "$CH_PID" spate
  REP=profile PROFILE_TO="$WORK/profile-sensor-upstream"
  sensor_arm "upstream spate 0.2.0 (RowBinary) -> chdb endpoint" upstream "$CHDB_URL" "$CHDB_PID" upstream
  PROFILE_TO=""
fi
{
  echo
  echo "Sensor workload: $SENSOR_MESSAGES SensorBatch messages (100 events each, $((SENSOR_MESSAGES * 100)) candidate rows, $EXP_KEPT kept by the filters) of Confluent-framed Avro in $BROKER_DESC, writer schema from the registry test fixture, into a fresh MergeTree table per run on ClickHouse $CH_VERSION or on the chdb endpoint (engine $CHDB_VERSION behind ci/chdb_server.py), one arm at a time, $REPS repetitions interleaved. Gates: count, duplicates and column checksums against the closed form. Command: \`bash ci/peer-bench.sh --kafka $KAFKA_KIND --workload $WORKLOAD --reps $REPS\`."
  echo
  "$PY" ci/peer_bench.py summarize "$RUNS_SENSOR" "$REPS"
  if [[ -s "$RUNS_DISCARD" ]]; then
    echo
    echo "Sensor workload into the discarding endpoint (\`ci/chdb_server.py --discard-inserts\`: every INSERT checked against the table and its body read, then answered 200 unexecuted): the arms' own CPU per row without the server's cost per insert. Nothing lands, so the gates are the arm's own count of rows acknowledged (exactly $EXP_KEPT) and the endpoint's answer to every insert; \"loss, dups\" is not measured (the tables above measure it)."
    echo
    "$PY" ci/peer_bench.py summarize "$RUNS_DISCARD" "$REPS"
  fi
} | tee -a "$OUT"
fi
