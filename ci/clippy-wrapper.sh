#!/usr/bin/env bash
# RUSTC_WORKSPACE_WRAPPER for ci/test.sh: compiles each workspace crate with
# clippy-driver (rustc plus clippy's lints, the code generated unchanged)
# and denies every warning, so the test build is the clippy run too.
exec clippy-driver "$@" -D warnings
