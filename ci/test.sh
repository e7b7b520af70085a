#!/usr/bin/env bash
# The one test command (docs/VERIFICATION.md; .ci/run calls exactly this).
# Runs: format check, clippy, unit + integration + proptest suites, the loom
# models (RUSTFLAGS="--cfg loom", separate target dir), the simulator
# campaign, and the benches in test mode so they cannot rot.
#
#   bash ci/test.sh                 everything above; the container tests
#                                   (engine/spate/tests/it/containers.rs) are
#                                   built, not run
#   bash ci/test.sh --containers    also runs them: needs a Docker engine
#                                   (current ClickHouse and Redpanda images)
#
# Where the time goes, and why it is arranged so (2 cores): the servers
# (ClickHouse, ZooKeeper, Kafka, the registry fixture, the chdb endpoint)
# start in the background while the test build runs and are waited for just
# before the tests. The test build is the clippy run too (every workspace
# crate compiled by clippy-driver, warnings denied: ci/clippy-wrapper.sh),
# so nothing is compiled twice. The test binaries then run in two lanes side
# by side (ci/run_tests.py: the real-server binaries one at a time, the
# others beside them), while the optimised builds (the loom models, the
# simulator campaign) and the TLS build check run at the lowest CPU priority,
# each in a target directory of its own. A table of every step's time is
# printed at the end, and on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

# The container tests are compiled with everything else (one feature set,
# so nothing is built twice) and skip unless SPATE_CONTAINERS=1.
export SPATE_CONTAINERS="${SPATE_CONTAINERS:-0}"
for arg in "$@"; do
  case "$arg" in
    --containers) SPATE_CONTAINERS=1 ;;
    *) echo "ci/test.sh: unknown argument $arg (known: --containers)" >&2; exit 2 ;;
  esac
done

# Every path into the build tree follows CARGO_TARGET_DIR (a common setup
# keeps it outside the checkout), as an absolute path (the tests run in
# their package directories); the chdb fixtures test writes its cases where
# the chdb step reads them.
TARGET="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
export TARGET CARGO_TARGET_DIR="$TARGET"
export SPATE_CHDB_DIR="${SPATE_CHDB_DIR:-$TARGET/chdb}"
# One chdb-core venv for ci/chdb_server.py and ci/chdb_check.py (ci/chdb_venv.py).
export SPATE_CHDB_VENV="${SPATE_CHDB_VENV:-$SPATE_CHDB_DIR/venv}"

# The dev/test build: no incremental state (a CI build starts from nothing
# and is never rebuilt incrementally) and line tables only for debug info
# (panics and backtraces keep file:line; full debug info made the test
# build's link steps slow and target/debug three times larger). Either can be
# overridden from the environment.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"
export CARGO_PROFILE_TEST_DEBUG="${CARGO_PROFILE_TEST_DEBUG:-line-tables-only}"
# The one feature set of every workspace build below (a different feature
# unification would rebuild dependencies).
WS=(--workspace --features spate/containers --locked)

# ---------------------------------------------------------------- timing
T0=$EPOCHSECONDS
export T0
STEP_NAMES=()
STEP_SECS=()
cur_step=""
cur_t0=0
end_step() {
  if [ -n "$cur_step" ]; then
    STEP_NAMES+=("$cur_step")
    STEP_SECS+=($((EPOCHSECONDS - cur_t0)))
    cur_step=""
  fi
}
# step LABEL DESCRIPTION: a new step (LABEL names it in the timing table).
step() {
  end_step
  cur_step="$1"
  cur_t0=$EPOCHSECONDS
  printf '\n== %s ==\n' "$2"
}

# ------------------------------------------------------ background jobs
# A job runs in a session of its own (setsid: one process group, stopped as
# a whole on exit if unfinished), its output in $BG/NAME.log, its exit
# status in $BG/NAME.rc, its start and end (seconds since T0) in
# $BG/NAME.t0 and $BG/NAME.t1.
BG=$(mktemp -d /tmp/spate-ci.XXXXXX)
export BG
BG_JOBS=()
# bg NAME NICENESS CMD...: starts CMD as job NAME.
bg() {
  local name=$1 niceness=$2
  shift 2
  echo $((EPOCHSECONDS - T0)) >"$BG/$name.t0"
  setsid nice -n "$niceness" bash -c '
    name=$1; shift
    "$@" >"$BG/$name.log" 2>&1
    rc=$?
    echo $((EPOCHSECONDS - T0)) >"$BG/$name.t1"
    echo $rc >"$BG/$name.rc"
  ' bg "$name" "$@" </dev/null &
  echo $! >"$BG/$name.pid"
  BG_JOBS+=("$name")
}
# bg_wait NAME WHAT: waits for job NAME and prints its output; exits naming
# WHAT if it failed.
bg_wait() {
  local name=$1 what=$2 rc
  while [ ! -f "$BG/$name.rc" ]; do
    if ! kill -0 "$(cat "$BG/$name.pid")" 2>/dev/null; then
      sleep 0.5
      [ -f "$BG/$name.rc" ] && break
      cat "$BG/$name.log" 2>/dev/null || true
      echo "ci/test.sh: $what ended without an exit status" >&2
      exit 1
    fi
    sleep 0.5
  done
  rc=$(cat "$BG/$name.rc")
  cat "$BG/$name.log"
  echo "($what: $(($(cat "$BG/$name.t1") - $(cat "$BG/$name.t0"))) s in the background, done at $(cat "$BG/$name.t1") s)"
  if [ "$rc" != 0 ]; then
    echo "ci/test.sh: $what failed (exit $rc); its output is above" >&2
    exit 1
  fi
}

# The servers' start scripts run one after another in one background job
# (on a machine that lacks a package they install it with apt-get, and two
# apt-gets at once fail on its lock); each one's stdout, stderr, exit status
# and times go to $BG/srv-NAME.{out,err,rc,t0,t1}.
repl() { SPATE_CH_DIR=/tmp/spate-ch-repl SPATE_CH_BASE_PORT=19123 bash ci/clickhouse.sh "$@"; }
server_step() {
  local name=$1 rc=0
  shift
  echo $((EPOCHSECONDS - T0)) >"$BG/srv-$name.t0"
  "$@" >"$BG/srv-$name.out" 2>"$BG/srv-$name.err" || rc=$?
  echo $((EPOCHSECONDS - T0)) >"$BG/srv-$name.t1"
  echo $rc >"$BG/srv-$name.rc"
  return $rc
}
# The ssl feature builds librdkafka against the system OpenSSL (docs/CONFIG.md
# "Kafka security"); GSSAPI (feature sasl, libsasl2-dev) is documented, not built.
ssl_dev_if_missing() {
  if ! pkg-config --exists openssl 2>/dev/null; then
    echo "libssl-dev missing; installing it for the ssl feature check"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends libssl-dev pkg-config
  fi
}
servers() {
  server_step prometheus bash ci/prometheus.sh install &&
    server_step clickhouse bash ci/clickhouse.sh start 1 &&
    server_step replicated repl start-replicated 2 2 &&
    server_step kafka bash ci/kafka.sh start 3 &&
    server_step registry bash ci/registry.sh start &&
    server_step libssl ssl_dev_if_missing
}
export -f repl server_step ssl_dev_if_missing servers
# server_wait NAME WHAT: waits for server step NAME, prints its log lines
# and sets SERVER_OUT to its stdout; exits naming WHAT (and showing its
# output) if it failed, or if the sequence stopped before it.
server_wait() {
  local name=$1 what=$2 rc
  while [ ! -f "$BG/srv-$name.rc" ]; do
    if [ -f "$BG/servers.rc" ]; then
      [ -f "$BG/srv-$name.rc" ] && break
      cat "$BG/servers.log" >&2 || true
      echo "ci/test.sh: the server start sequence ended before $what (an earlier server failed; see above)" >&2
      exit 1
    fi
    sleep 0.5
  done
  rc=$(cat "$BG/srv-$name.rc")
  cat "$BG/srv-$name.err"
  if [ "$rc" != 0 ]; then
    cat "$BG/srv-$name.out"
    echo "ci/test.sh: $what failed (exit $rc, after $(($(cat "$BG/srv-$name.t1") - $(cat "$BG/srv-$name.t0"))) s); its log lines are above" >&2
    exit 1
  fi
  echo "($what: $(($(cat "$BG/srv-$name.t1") - $(cat "$BG/srv-$name.t0"))) s, ready at $(cat "$BG/srv-$name.t1") s)"
  SERVER_OUT=$(cat "$BG/srv-$name.out")
}

chdb_pid=""
chdb_dir=""
kafka_stopping=0
cleanup() {
  local rc=$? name pid i
  set +e
  end_step
  # Unfinished background jobs first (a half-done server sequence must not
  # start anything after the stops below), then every server.
  for name in "${BG_JOBS[@]}"; do
    if [ "$name" = kafka-stop ]; then
      continue # the stop, started: let it finish (below)
    fi
    if [ ! -f "$BG/$name.rc" ] && pid=$(cat "$BG/$name.pid" 2>/dev/null); then
      kill -TERM -- "-$pid" 2>/dev/null
    fi
  done
  [ -n "$chdb_pid" ] && kill "$chdb_pid" 2>/dev/null
  [ -n "$chdb_dir" ] && rm -rf "$chdb_dir"
  # The two ClickHouse layouts stop side by side (a few seconds each).
  bash ci/clickhouse.sh stop >/dev/null 2>&1 &
  pid=$!
  repl stop >/dev/null 2>&1
  wait "$pid"
  if [ "$kafka_stopping" = 0 ]; then
    bash ci/kafka.sh stop >/dev/null 2>&1
    bash ci/registry.sh stop >/dev/null 2>&1
  else
    while [ ! -f "$BG/kafka-stop.rc" ] && kill -0 "$(cat "$BG/kafka-stop.pid")" 2>/dev/null; do sleep 0.5; done
  fi
  printf '\n== timing (%s) ==\n' "$([ "$rc" = 0 ] && echo "passed" || echo "FAILED, exit $rc")"
  for i in "${!STEP_NAMES[@]}"; do
    printf '%5d s  %s\n' "${STEP_SECS[$i]}" "${STEP_NAMES[$i]}"
  done
  printf 'in the background (seconds since the start: from-to):\n'
  for name in "${BG_JOBS[@]}" $(cd "$BG" && ls srv-*.t0 2>/dev/null | sed 's/\.t0$//'); do
    [ "$name" = servers ] && continue
    if [ -f "$BG/$name.t1" ]; then
      printf '%5d s  %s (%d-%d)\n' $(($(cat "$BG/$name.t1") - $(cat "$BG/$name.t0"))) "$name" \
        "$(cat "$BG/$name.t0")" "$(cat "$BG/$name.t1")"
    else
      printf '    - s  %s (from %d, unfinished)\n' "$name" "$(cat "$BG/$name.t0")"
    fi
  done
  printf '%5d s  total\n' $((EPOCHSECONDS - T0))
  rm -rf "$BG"
  exit "$rc"
}
trap cleanup EXIT

# ----------------------------------------------------------------- steps
step toolchain "toolchain"
cargo --version
rustc --version
clippy-driver --version

step fmt "cargo fmt --check"
cargo fmt --all -- --check

step design "docs/DESIGN.md: every test, oracle and planted bug under 'Checked by' exists"
python3 ci/check_design.py
python3 ci/check_docs.py  # links, anchors, scripts, cargo targets, alert/dashboard tables, config keys (self-test first)
python3 -m unittest -q ci/test_peer_bench.py  # ci/peer_bench.py: the arm table, /proc parsing, the watch loop, gates, summary

step servers "the servers, started in the background (each is waited for before the tests)"
# Debian's prometheus package (prometheus and promtool) if missing; one
# plain ClickHouse, and 2 shards x 2 ReplicatedMergeTree replicas with a
# local ZooKeeper (ci/clickhouse.sh); Apache Kafka 4.4, 3 KRaft nodes
# (controller+broker each), RF 3, min.insync.replicas 2, the jars from Maven
# Central once (target/kafka-libs, the Maven cache) (ci/kafka.sh); the
# schema registry TEST FIXTURE (ci/registry.sh: no real registry can be
# assembled here, see ci/registry_fixture.py's header); libssl-dev for the
# ssl check if missing. A server that cannot start fails the run below with
# its log lines. All are stopped on exit.
bg servers 0 servers
# A current ClickHouse engine behind a test endpoint (ci/chdb_server.py,
# chdb-core): not a server: chdb-core's engine is real, the HTTP layer is
# ours (read the script's header). Two ports of one process share one chdb
# session, so they act as two replicas of one table
# (engine/spate/tests/it/chdb.rs). The first run installs chdb-core into
# $SPATE_CHDB_VENV (pip, ~530 MB).
chdb_dir=$(mktemp -d /tmp/spate-chdb.XXXXXX)
python3 ci/chdb_server.py --port 0 --port 0 --data "$chdb_dir/data" >"$chdb_dir/urls" 2>"$chdb_dir/log" &
chdb_pid=$!
chdb_t0=$((EPOCHSECONDS - T0))
echo "started"

step build "cargo test --no-run, which is the clippy run too (all targets, -D warnings)"
# Every workspace crate through clippy-driver with warnings denied, as
# `cargo clippy --all-targets -- -D warnings` would check them (the lib,
# its unit tests, bins, tests, examples; the benches in the job below); the
# dependencies through plain rustc. The binaries are listed in
# $BG/tests.json for ci/run_tests.py, which runs them without cargo, so the
# target directory is free for the job below while the tests run. Cargo
# does not fingerprint the wrapper: a crate is linted whenever it is
# compiled, and the profile settings above keep these artifacts apart from
# an ordinary `cargo test` build (which would otherwise be reused unlinted).
clippy_wrapper="$PWD/ci/clippy-wrapper.sh"
RUSTC_WORKSPACE_WRAPPER="$clippy_wrapper" \
  cargo test "${WS[@]}" --no-run --message-format=json-render-diagnostics >"$BG/tests.json"

# Beside the tests, at the lowest CPU priority: the benches built (clippy
# too, the same wrapper) and run once each in test mode, and the doc tests
# (the same wrapper again: they link the libraries built above).
benches() (
  set -e
  ws=(--workspace --features spate/containers --locked) # as WS above
  cargo test "${ws[@]}" --bench '*' --no-run --message-format=json-render-diagnostics >"$BG/benches.json"
  cargo test "${ws[@]}" --doc
  python3 ci/run_tests.py "$BG/benches.json" benches
)
export -f benches
bg benches 19 env RUSTC_WORKSPACE_WRAPPER="$clippy_wrapper" bash -c benches

# The optimised builds, one after another in one job at the lowest CPU
# priority while the tests run, each in a target directory of its own (no
# cargo waits on another's lock): the simulator campaign's spate-verify
# (--profile ci) and its two runs; the loom models (--cfg loom: spate-core's
# atomics and sync primitives become loom's, so nothing of another build is
# reusable) built and run. Their output is printed in their steps below.
campaign() (
  set -e
  CARGO_TARGET_DIR="$TARGET/campaign" cargo build -p spate-verify --locked --profile ci
  verify="$TARGET/campaign/ci/spate-verify"
  "$verify" campaign --delivery both --first 0 --seeds 20000 --eo-seeds 10000 --min-coverage 1
  fresh=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
  echo "fresh seeds start at $fresh (replay one with: cargo run -p spate-verify --release -- replay SEED [--delivery effectively_once])"
  "$verify" campaign --delivery both --first "$fresh" --seeds 2000
)
loom() (
  set -e
  LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$TARGET/loom" \
    cargo test -p spate-core --locked --profile ci --test loom_models
)
export -f campaign loom
bg campaign 19 campaign
bg loom 19 bash -c 'while [ ! -f "$BG/campaign.rc" ]; do sleep 1; done; loom'

step prometheus "Prometheus: the alert rules (promtool check rules, promtool test rules) and the dashboard (ci/prometheus.sh)"
# engine/spate/tests/it/ops_prometheus.rs (in the tests below) starts a real
# Prometheus with ci/prometheus.sh scraping `spate run` around a frozen
# shard; SPATE_PROMETHEUS_REQUIRED=1 makes it fail, not skip, without one.
server_wait prometheus "the Prometheus install (ci/prometheus.sh install)"
bash ci/prometheus.sh check
python3 ops/grafana/build_dashboard.py --check
export SPATE_PROMETHEUS_REQUIRED=1

step wait-servers "the servers for the real-server tests"
server_wait clickhouse "ClickHouse (ci/clickhouse.sh start 1)"
SPATE_CLICKHOUSE_URL=$(head -n1 <<<"$SERVER_OUT")
export SPATE_CLICKHOUSE_URL
echo "SPATE_CLICKHOUSE_URL=$SPATE_CLICKHOUSE_URL"
server_wait replicated "the replicated ClickHouse and ZooKeeper (ci/clickhouse.sh start-replicated 2 2)"
SPATE_CLICKHOUSE_SHARDS=$(paste -sd';' <<<"$SERVER_OUT")
export SPATE_CLICKHOUSE_SHARDS
echo "SPATE_CLICKHOUSE_SHARDS=$SPATE_CLICKHOUSE_SHARDS"
# Say what the server lacks rather than skip silently.
ch_http=${SPATE_CLICKHOUSE_URL##*:}
if [ "$(clickhouse-client --port $((ch_http + 1)) -q "SELECT count() FROM system.settings WHERE name = 'insert_deduplication_token'")" = 0 ]; then
  echo "ClickHouse $(clickhouse-client --port $((ch_http + 1)) -q 'SELECT version()') lacks insert_deduplication_token: retries rely on ReplicatedMergeTree block dedup (identical bytes), tested in engine/clickhouse/tests/it/replicated.rs"
fi

for _ in $(seq 1 1200); do
  [ "$(wc -l <"$chdb_dir/urls")" -ge 2 ] && break
  kill -0 $chdb_pid 2>/dev/null || { cat "$chdb_dir/log" >&2; echo "ci/chdb_server.py did not start" >&2; exit 1; }
  sleep 0.5
done
[ "$(wc -l <"$chdb_dir/urls")" -ge 2 ] || { cat "$chdb_dir/log" >&2; echo "ci/chdb_server.py did not answer in 10 minutes" >&2; exit 1; }
cat "$chdb_dir/log"
echo "(the chdb endpoint: started at $chdb_t0 s, ready by $((EPOCHSECONDS - T0)) s)"
SPATE_CHDB_URLS=$(paste -sd, "$chdb_dir/urls")
export SPATE_CHDB_URLS
echo "SPATE_CHDB_URLS=$SPATE_CHDB_URLS"

# engine/spate/tests/it/real_kafka.rs runs against it; SPATE_KAFKA_REQUIRED=1
# makes those tests fail, not skip, without SPATE_KAFKA_BROKERS.
server_wait kafka "Apache Kafka 4.4 (ci/kafka.sh start 3)"
SPATE_KAFKA_BROKERS=$(tail -n1 <<<"$SERVER_OUT")
export SPATE_KAFKA_BROKERS SPATE_KAFKA_REQUIRED=1
echo "SPATE_KAFKA_BROKERS=$SPATE_KAFKA_BROKERS"

# engine/spate/tests/it/avro.rs runs the workload through it;
# SPATE_REGISTRY_REQUIRED=1 makes those tests fail, not fall back, without
# SPATE_REGISTRY_URL.
server_wait registry "the schema registry fixture (ci/registry.sh start)"
SPATE_REGISTRY_URL=$(tail -n1 <<<"$SERVER_OUT")
export SPATE_REGISTRY_URL SPATE_REGISTRY_REQUIRED=1
echo "SPATE_REGISTRY_URL=$SPATE_REGISTRY_URL"

# spate-kafka with TLS and SASL PLAIN/SCRAM: a check build of librdkafka
# against the system OpenSSL, in the background beside the tests.
server_wait libssl "libssl-dev for the ssl feature check"
bg ssl-check 19 env CARGO_TARGET_DIR="$TARGET/ssl" cargo check -p spate-kafka --features ssl --locked

step test "the tests: unit, integration, proptest, real ClickHouse, real Kafka (ci/run_tests.py)"
python3 ci/run_tests.py "$BG/tests.json" lanes

step test-e2e-real "the mock-cluster e2e tests again, same bodies, on the real Kafka cluster"
# engine/spate/tests/it/e2e.rs (module e2e of spate's test binary); the
# broker is chosen by the environment (common::Broker).
SPATE_E2E_KAFKA=real python3 ci/run_tests.py "$BG/tests.json" run spate it -- e2e::
# Kafka's controlled shutdown takes ~16 s: in the background (the exit
# trap stops ClickHouse).
kafka_stopping=1
bg kafka-stop 0 bash -c 'bash ci/kafka.sh stop && bash ci/registry.sh stop'
if [ "$SPATE_CONTAINERS" = 1 ]; then
  echo "container tests ran (engine/spate/tests/it/containers.rs)"
else
  echo "container tests built, not run (bash ci/test.sh --containers runs them; needs Docker)"
fi

step benches "doc tests, and the benches in test mode (each criterion bench runs once, so none can rot)"
bg_wait benches "the benches' build (clippy too), the doc tests and the benches in test mode"

step example "examples that check themselves: the Avro sensor workload through the chain's typed operators (a few seconds)"
# Exits non-zero when its totals differ from the workload's closed form.
MESSAGES=300 "$(python3 ci/run_tests.py "$BG/tests.json" example avro_sensor)"

step chdb-check "types 18.16 lacks, decoded by a current ClickHouse (chdb-core)"
python3 ci/chdb_check.py "$SPATE_CHDB_DIR"

step ssl "spate-kafka with TLS and SASL PLAIN/SCRAM (cargo check --features ssl)"
bg_wait ssl-check "cargo check -p spate-kafka --features ssl"

step campaign "simulator campaign: 20000 fixed seeds in at_least_once and 10000 in effectively_once (each fault kind and combination >= 1% in each), then 2000 fresh ones in each; 1% of each re-run for determinism (D1, D4, D5, D6, D7, D8, D9, values, liveness; about 25 CPU s)"
bg_wait campaign "spate-verify's build (--profile ci) and its campaigns"

step loom "loom models (--cfg loom)"
bg_wait loom "the loom models (--profile ci, --cfg loom)"

step stop "Kafka and the registry stopped (in the background since the tests ended)"
bg_wait kafka-stop "ci/kafka.sh stop, ci/registry.sh stop"
