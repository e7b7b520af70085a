#!/usr/bin/env bash
# The one test command (README "Tests"; .ci/run calls exactly this).
# Runs: format check, clippy, unit + integration + proptest suites, the loom
# models (RUSTFLAGS="--cfg loom", separate target dir), and the benches in
# test mode so they cannot rot.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s ==\n' "$*"; }

step "toolchain"
cargo --version
rustc --version

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "ClickHouse for the real-server tests (ci/clickhouse.sh)"
trap 'bash ci/clickhouse.sh stop || true' EXIT
SPATE_CLICKHOUSE_URL=$(bash ci/clickhouse.sh start 1 | head -n1)
export SPATE_CLICKHOUSE_URL
echo "SPATE_CLICKHOUSE_URL=$SPATE_CLICKHOUSE_URL"

step "cargo test (unit, integration, proptest, real ClickHouse)"
cargo test --workspace --locked

step "loom models (--cfg loom)"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p spate-core --locked --profile ci --test loom_models

step "simulator campaign: 2000 fixed seeds, then 200 fresh ones (D1, D4, D5, D6, liveness)"
cargo build -p spate-verify --locked --profile ci
target/ci/spate-verify campaign --first 0 --seeds 2000
fresh=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
echo "fresh seeds start at $fresh (replay one with: cargo run -p spate-verify --release -- replay SEED)"
target/ci/spate-verify campaign --first "$fresh" --seeds 200

step "benches in test mode (each criterion bench runs once, so none can rot)"
cargo test -p spate-benches --benches --locked
