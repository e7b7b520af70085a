#!/usr/bin/env bash
# Side-by-side benchmark (issue 22): spate against ClickHouse's Kafka engine,
# a plain Python consumer, clickhouse_sinker and upstream spate, on the
# flights and the sensor workloads. The benchmark is ci/peer_bench.py (issue
# 29: one arm runner in Python); `bash ci/peer-bench.sh --help` prints what it
# runs, measures and gates, and every setting.
#
#   bash ci/peer-bench.sh [--kafka real|mock] [--workload flights|sensor|all] [--reps N] [ROWS]
set -euo pipefail
exec python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/peer_bench.py" bench "$@"
