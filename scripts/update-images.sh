#!/usr/bin/env bash
# Rebuilds the kernels from source with the pinned toolchain and ptxas and writes the result into
# host/kernel-images/ (the images the package ships; CI fails when they differ from a build of the
# sources). Run after changing anything under kernels/, then commit host/kernel-images.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
export BLOCKSCALED_REQUIRE_PTXAS=1 BLOCKSCALED_BUILD_KERNELS=1
unset BLOCKSCALED_CHECK_IMAGES
cargo build -p blockscaled
for f in sm_90a.ptx sm_90a.cubin sm_100a.ptx sm_100a.cubin MANIFEST; do
  cp target/debug/ptx/$f host/kernel-images/$f
done
ls -l host/kernel-images
