#!/usr/bin/env bash
# blockscaled-candle on a machine without a GPU: installs what candle's CUDA build needs
# (`setup.sh --candle`: nvcc, the CUDA headers, link-time stand-ins for the CUDA libraries),
# then type-checks and lints every target (clippy; its tests need a GPU and the CUDA libraries to
# start, so they are built, linked and run on a GPU machine: scripts/stage-gpu.sh), and packages
# it with the crates it depends on (not verified by a second build: that would compile candle's
# CUDA kernels again, minutes of nvcc, for the same sources). blockscaled comes from its shipped
# kernel images here (test.sh checks them against a build from source).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh --candle)"
export BLOCKSCALED_BUILD_KERNELS=0
cargo clippy -p blockscaled-candle --all-targets -- -D warnings
cargo package -p blockscaled-kernels -p blockscaled-builder -p blockscaled -p blockscaled-candle \
  --no-verify --allow-dirty 2>&1 | grep -E '^ *(Packaged|error)' >&2
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
size=$(stat -c %s "target/package/blockscaled-candle-$version.crate")
echo "package blockscaled-candle $size bytes"
