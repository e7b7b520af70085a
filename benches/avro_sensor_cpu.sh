#!/usr/bin/env bash
# Rows per CPU-second of spate's own process on the sensor workload (issue
# 21: Avro decode + fan-out + filter + encode + insert), release build:
# 10,000 SensorBatch messages (1,000,000 candidate rows, 787,500 kept) on an
# embedded broker (`spate broker`, another process), through the registry
# at $REG into `sensor_events` on the ClickHouse at $CH (native port
# $CHPORT), with examples/avro-sensor.yaml (no dead-letter topic). The CPU
# is spate's utime+stime from /proc when the last row is visible, start-up
# and the group join included. A number for a report, never an assertion.
#
#   cargo build --release -p spate
#   CH=http://127.0.0.1:18123 REG=$(bash ci/registry.sh start | tail -n1) \
#     bash benches/avro_sensor_cpu.sh
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
BIN=${BIN:-$REPO/target/release/spate}
CH=${CH:?set CH to the ClickHouse HTTP URL}
REG=${REG:?set REG to the schema registry URL}
# ci/clickhouse.sh: the native port is the HTTP port + 1.
CHPORT=${CHPORT:-$(( ${CH##*:} + 1 ))}
BROKER_PORT=${BROKER_PORT:-29290}
# 10,000 messages: 787,500 kept rows (tests/it/avro.rs computes it).
N=10000
work=$(mktemp -d /tmp/spate-avro-cpu.XXXX)
# An embedded broker in its own process (librdkafka's mock cluster):
# 16 partitions keep each under its 5 MiB retention (~36 MB in all).
"$BIN" broker --port "$BROKER_PORT" --topic sensors --partitions 16 >"$work/broker.log" 2>&1 &
broker=$!
trap 'kill $broker 2>/dev/null || true' EXIT
sleep 2
clickhouse-client --port "$CHPORT" -q "DROP TABLE IF EXISTS sensor_events"
sed -n '/CREATE TABLE/,/ENGINE/p' $REPO/examples/avro-sensor.yaml | sed 's/^#//' >"$work/ddl.sql"
clickhouse-client --port "$CHPORT" --multiquery <"$work/ddl.sql"
"$BIN" produce --brokers "127.0.0.1:$BROKER_PORT" --topic sensors --sensor "$N" --registry "$REG" --subject "sensors-value" 2>/dev/null | tail -1
sed -e '/dead_letter:/d' -e '/topic: sensors-dead-letter/d' -e 's/group_id: spate-sensor-events/group_id: measure-'$$'/' \
  $REPO/examples/avro-sensor.yaml >"$work/run.yaml"
want=787500
KAFKA_BROKERS=127.0.0.1:$BROKER_PORT SCHEMA_REGISTRY_URL=$REG CLICKHOUSE_URL=$CH \
  "$BIN" run -c "$work/run.yaml" >"$work/run.out" 2>"$work/run.log" &
spate=$!
t0=$(date +%s.%N)
while :; do
  n=$(clickhouse-client --port "$CHPORT" -q "SELECT count() FROM sensor_events")
  [ "$n" -ge "$want" ] && break
  kill -0 $spate || { cat "$work/run.log"; exit 1; }
  sleep 0.2
done
t1=$(date +%s.%N)
read -r utime stime < <(awk '{print $14, $15}' /proc/$spate/stat)
tck=$(getconf CLK_TCK)
kill -TERM $spate; wait $spate || true
cpu=$(echo "($utime + $stime) / $tck" | bc -l)
printf 'rows landed %d of %d candidates; spate CPU %.2f s (user %.2f, sys %.2f); wall %.1f s\n' \
  "$n" $((N * 100)) "$cpu" "$(echo "$utime/$tck" | bc -l)" "$(echo "$stime/$tck" | bc -l)" "$(echo "$t1 - $t0" | bc -l)"
printf 'kept rows per CPU-second: %.0f; candidate rows per CPU-second: %.0f\n' \
  "$(echo "$n / $cpu" | bc -l)" "$(echo "$N * 100 / $cpu" | bc -l)"
cat "$work/run.out"
