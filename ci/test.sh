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

step "cargo test (unit, integration, proptest)"
cargo test --workspace --locked

step "loom models (--cfg loom)"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p spate-core --locked --profile loom --test loom_models

step "benches in test mode"
if [ -d benches ]; then
  cargo bench --workspace --locked -- --test
fi
