#!/usr/bin/env bash
# The test command (README): sets up, builds the kernels for sm_90a and sm_100a from source (ptxas
# must accept both) and fails if they differ from the shipped images in host/kernel-images, runs
# every test that needs no GPU, packages every published crate (size checked), and builds a
# throwaway project that depends on blockscaled with stable Rust, and checks it as a dependency
# (its declared rust-version, and beside cudarc with candle's features). GPU tests are reported as
# ignored here; run them on a GPU machine with scripts/stage-gpu.sh. blockscaled-candle is built
# and checked on its own (scripts/check-candle.sh): it needs a CUDA toolkit, which setup.sh installs.
# The Python package is built with pip and its CPU tests run (scripts/check-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
export BLOCKSCALED_REQUIRE_PTXAS=1 BLOCKSCALED_CHECK_IMAGES=1 BLOCKSCALED_BUILD_KERNELS=1
cargo fmt --all --check
cargo clippy --workspace --exclude blockscaled-candle --all-targets -- -D warnings
cargo test --workspace --exclude blockscaled-candle --all-targets
scripts/check-candle.sh
scripts/check-package.sh
scripts/check-user-build.sh
scripts/check-as-dependency.sh
scripts/check-python.sh
