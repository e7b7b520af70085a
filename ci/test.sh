#!/usr/bin/env bash
# The one test command (README "Tests"; .ci/run calls exactly this).
# Runs: format check, clippy, unit + integration + proptest suites, the loom
# models (RUSTFLAGS="--cfg loom", separate target dir), and the benches in
# test mode so they cannot rot.
#
#   bash ci/test.sh                 everything above; the container tests
#                                   (engine/spate/tests/it/containers.rs) are
#                                   built, not run
#   bash ci/test.sh --containers    also runs them: needs a Docker engine
#                                   (current ClickHouse and Redpanda images)
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

step() { printf '\n== %s ==\n' "$*"; }

# Every path into the build tree follows CARGO_TARGET_DIR (a common setup
# keeps it outside the checkout), as an absolute path (cargo runs each test
# in its package directory); the chdb fixtures test writes its cases
# where the chdb step reads them.
TARGET="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
export SPATE_CHDB_DIR="${SPATE_CHDB_DIR:-$TARGET/chdb}"
# One chdb-core venv for ci/chdb_server.py and ci/chdb_check.py (ci/chdb_venv.py).
export SPATE_CHDB_VENV="${SPATE_CHDB_VENV:-$SPATE_CHDB_DIR/venv}"

step "toolchain"
cargo --version
rustc --version

step "cargo fmt --check"
cargo fmt --all -- --check

step "docs/DESIGN.md: every test, oracle and planted bug under 'Checked by' exists"
python3 ci/check_design.py

step "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --features spate/containers --locked -- -D warnings

step "Prometheus: the alert rules (promtool check rules, promtool test rules) and the dashboard (ci/prometheus.sh)"
# Debian's prometheus package (prometheus and promtool), installed if missing.
# engine/spate/tests/it/ops_prometheus.rs (in cargo test below) starts a real
# Prometheus with ci/prometheus.sh scraping `spate run` around a frozen
# shard; SPATE_PROMETHEUS_REQUIRED=1 makes it fail, not skip, without one.
bash ci/prometheus.sh install
bash ci/prometheus.sh check
python3 ops/grafana/build_dashboard.py --check
export SPATE_PROMETHEUS_REQUIRED=1

step "ClickHouse for the real-server tests (ci/clickhouse.sh)"
# One plain instance, and 2 shards x 2 ReplicatedMergeTree replicas with a
# local ZooKeeper; both stopped on exit (one trap: a second would replace it).
repl() { SPATE_CH_DIR=/tmp/spate-ch-repl SPATE_CH_BASE_PORT=19123 bash ci/clickhouse.sh "$@"; }
trap 'bash ci/clickhouse.sh stop || true; repl stop || true; bash ci/kafka.sh stop || true; bash ci/registry.sh stop || true' EXIT
SPATE_CLICKHOUSE_URL=$(bash ci/clickhouse.sh start 1 | head -n1)
export SPATE_CLICKHOUSE_URL
echo "SPATE_CLICKHOUSE_URL=$SPATE_CLICKHOUSE_URL"
SPATE_CLICKHOUSE_SHARDS=$(repl start-replicated 2 2 | paste -sd';')
export SPATE_CLICKHOUSE_SHARDS
echo "SPATE_CLICKHOUSE_SHARDS=$SPATE_CLICKHOUSE_SHARDS"
# Say what the server lacks rather than skip silently.
ch_http=${SPATE_CLICKHOUSE_URL##*:}
if [ "$(clickhouse-client --port $((ch_http + 1)) -q "SELECT count() FROM system.settings WHERE name = 'insert_deduplication_token'")" = 0 ]; then
  echo "ClickHouse $(clickhouse-client --port $((ch_http + 1)) -q 'SELECT version()') lacks insert_deduplication_token: retries rely on ReplicatedMergeTree block dedup (identical bytes), tested in engine/clickhouse/tests/replicated.rs"
fi

step "a current ClickHouse engine behind a test endpoint (ci/chdb_server.py, chdb-core)"
# Not a server: chdb-core's engine is real, the HTTP layer is ours (read the
# script's header). Two ports of one process share one chdb session, so they
# act as two replicas of one table (engine/spate/tests/it/chdb.rs).
chdb_dir=$(mktemp -d /tmp/spate-chdb.XXXXXX)
python3 ci/chdb_server.py --port 0 --port 0 --data "$chdb_dir/data" >"$chdb_dir/urls" 2>"$chdb_dir/log" &
chdb_pid=$!
trap 'kill $chdb_pid 2>/dev/null || true; rm -rf "$chdb_dir"; bash ci/clickhouse.sh stop || true; repl stop || true; bash ci/kafka.sh stop || true; bash ci/registry.sh stop || true' EXIT
# The first run installs chdb-core into $SPATE_CHDB_VENV (pip, ~530 MB).
for _ in $(seq 1 1200); do
  [ "$(wc -l <"$chdb_dir/urls")" -ge 2 ] && break
  kill -0 $chdb_pid 2>/dev/null || { cat "$chdb_dir/log" >&2; echo "ci/chdb_server.py did not start" >&2; exit 1; }
  sleep 0.5
done
[ "$(wc -l <"$chdb_dir/urls")" -ge 2 ] || { cat "$chdb_dir/log" >&2; echo "ci/chdb_server.py did not answer in 10 minutes" >&2; exit 1; }
cat "$chdb_dir/log"
SPATE_CHDB_URLS=$(paste -sd, "$chdb_dir/urls")
export SPATE_CHDB_URLS
echo "SPATE_CHDB_URLS=$SPATE_CHDB_URLS"

step "Apache Kafka 4.4 for the real-broker tests (ci/kafka.sh)"
# 3 KRaft nodes (controller+broker each), RF 3, min.insync.replicas 2; the
# jars come from Maven Central once (target/kafka-libs, the Maven cache).
# engine/spate/tests/it/real_kafka.rs runs against it; SPATE_KAFKA_REQUIRED=1
# makes those tests fail, not skip, without SPATE_KAFKA_BROKERS. A broker
# that cannot start fails this step with its log lines (set -e).
kafka_t0=$SECONDS
SPATE_KAFKA_BROKERS=$(bash ci/kafka.sh start 3 | tail -n1)
export SPATE_KAFKA_BROKERS SPATE_KAFKA_REQUIRED=1
echo "SPATE_KAFKA_BROKERS=$SPATE_KAFKA_BROKERS (up after $((SECONDS - kafka_t0))s)"

step "schema registry for the Avro/Protobuf tests (ci/registry.sh: a TEST FIXTURE)"
# ci/registry_fixture.py serves the Confluent REST subset spate uses (no real
# registry can be assembled here: see its header). engine/spate/tests/it/avro.rs
# runs the workload through it; SPATE_REGISTRY_REQUIRED=1 makes those tests
# fail, not fall back, without SPATE_REGISTRY_URL. A fixture that cannot
# start fails this step (set -e); it is up in under a second.
SPATE_REGISTRY_URL=$(bash ci/registry.sh start | tail -n1)
export SPATE_REGISTRY_URL SPATE_REGISTRY_REQUIRED=1
echo "SPATE_REGISTRY_URL=$SPATE_REGISTRY_URL"

step "cargo test (unit, integration, proptest, real ClickHouse, real Kafka)"
cargo test --workspace --features spate/containers --locked
# The mock-cluster e2e tests again, same bodies, on the real cluster
# (--workspace: the same feature set as above, so nothing is rebuilt).
SPATE_E2E_KAFKA=real cargo test --workspace --features spate/containers --locked --test it -- e2e::
bash ci/kafka.sh stop
bash ci/registry.sh stop
if [ "$SPATE_CONTAINERS" = 1 ]; then
  echo "container tests ran (engine/spate/tests/it/containers.rs)"
else
  echo "container tests built, not run (bash ci/test.sh --containers runs them; needs Docker)"
fi

step "spate-kafka with TLS and SASL PLAIN/SCRAM (cargo check --features ssl)"
# The ssl feature builds librdkafka against the system OpenSSL (README "Kafka
# security"); GSSAPI (feature sasl, libsasl2-dev) is documented, not built.
if ! pkg-config --exists openssl 2>/dev/null; then
  echo "libssl-dev missing; installing it for the ssl feature check"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libssl-dev pkg-config
fi
cargo check -p spate-kafka --features ssl --locked

step "types 18.16 lacks, decoded by a current ClickHouse (chdb-core)"
python3 ci/chdb_check.py "$SPATE_CHDB_DIR"

step "loom models (--cfg loom)"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$TARGET/loom" \
  cargo test -p spate-core --locked --profile ci --test loom_models

step "simulator campaign: 20000 fixed seeds in at_least_once and 10000 in effectively_once (each fault kind and combination >= 1% in each), then 2000 fresh ones in each; 1% of each re-run for determinism (D1, D4, D5, D6, D7, D8, D9, values, liveness; about 25 CPU s)"
cargo build -p spate-verify --locked --profile ci
"$TARGET"/ci/spate-verify campaign --delivery both --first 0 --seeds 20000 --eo-seeds 10000 --min-coverage 1
fresh=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
echo "fresh seeds start at $fresh (replay one with: cargo run -p spate-verify --release -- replay SEED [--delivery effectively_once])"
"$TARGET"/ci/spate-verify campaign --delivery both --first "$fresh" --seeds 2000

step "benches in test mode (each criterion bench runs once, so none can rot)"
cargo test -p spate-benches --benches --locked

step "examples that check themselves: the Avro sensor workload through the chain's typed operators (a few seconds)"
# Exits non-zero when its totals differ from the workload's closed form.
MESSAGES=300 cargo run -p spate-clickhouse --example avro_sensor --locked
