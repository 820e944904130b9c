#!/usr/bin/env bash
# The test command (README): sets up, builds the kernels for sm_90a and sm_100a (ptxas must
# accept both), and runs every test that needs no GPU. GPU tests are reported as ignored here;
# run them on a GPU machine with scripts/stage-gpu.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
export BLOCKSCALED_REQUIRE_PTXAS=1
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --all-targets
