#!/usr/bin/env bash
# Installs what building blockscaled needs on a fresh machine: the pinned nightly toolchain with the
# components rust-toolchain.toml lists (rust-src for -Zbuild-std, llvm-tools for the PTX link),
# the pinned ptxas (the pip package nvidia-cuda-nvcc, version below, installed on its own with
# `pip --target` so no other CUDA on the machine can stand in for it; no CUDA install needed), and
# the pinned nvdisasm the same way (nvidia-cuda-nvdisasm), with which the kernel build reads the
# cubins' SASS back to find spills inside K loops. Prints the lines to export PTXAS and NVDISASM.
# Idempotent.
#
# Why this version: ptxas makes the cubins the host embeds next to the PTX. A cubin needs a driver
# at least as new as its ptxas' CUDA release; 13.0 is what the r580 drivers of the GPU machines
# implement, and it is the driver's own JIT compiler there, so the cubin's SASS is what the PTX
# JIT gave before. Pinned so that every build makes the same SASS. builder/src/lib.rs
# (PINNED_PTXAS_VERSION) checks the version it runs against this one.
#
# nvdisasm only reads what that ptxas made, so its release matters less; NVIDIA publishes it as a
# pip package from CUDA 13.2 on (none of 13.0), and this is a 13.2 one (PINNED_NVDISASM_VERSION
# there).
set -euo pipefail
cd "$(dirname "$0")/.."
PTXAS_VERSION=13.0.88
NVDISASM_VERSION=13.2.86
rustup toolchain install >/dev/null   # reads rust-toolchain.toml (RUSTUP_AUTO_INSTALL may be 0)
tools=${BLOCKSCALED_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/blockscaled}
dir="$tools/cuda-nvcc-$PTXAS_VERSION"
ptxas="$dir/nvidia/cu13/bin/ptxas"
# (The version is read whole before it is matched: `grep -q` would stop reading at the match,
# and ptxas, still printing its last line, would die of SIGPIPE and fail the pipeline.)
has_ptxas() { local v; v=$("$ptxas" --version 2>/dev/null) && grep -q "V$PTXAS_VERSION\$" <<<"$v"; }
if ! has_ptxas; then
  py=$(command -v python3 || command -v python)
  rm -rf "$dir"
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$dir" "nvidia-cuda-nvcc==$PTXAS_VERSION" >&2
fi
if ! has_ptxas; then
  echo "setup.sh: ptxas $PTXAS_VERSION not found at $ptxas after installing it" >&2
  exit 1
fi
echo "ptxas $("$ptxas" --version | grep -o 'V[0-9.]*$') at $ptxas" >&2
echo "export PTXAS=$ptxas"

disasm_dir="$tools/cuda-nvdisasm-$NVDISASM_VERSION"
nvdisasm="$disasm_dir/nvidia/cu13/bin/nvdisasm"
has_nvdisasm() { local v; v=$("$nvdisasm" --version 2>/dev/null) && grep -q "V$NVDISASM_VERSION\$" <<<"$v"; }
if ! has_nvdisasm; then
  py=$(command -v python3 || command -v python)
  rm -rf "$disasm_dir"
  "$py" -m pip install --quiet --disable-pip-version-check --no-deps \
    --target "$disasm_dir" "nvidia-cuda-nvdisasm==$NVDISASM_VERSION" >&2
fi
if ! has_nvdisasm; then
  echo "setup.sh: nvdisasm $NVDISASM_VERSION not found at $nvdisasm after installing it" >&2
  exit 1
fi
echo "nvdisasm V$NVDISASM_VERSION at $nvdisasm" >&2
echo "export NVDISASM=$nvdisasm"

# `setup.sh --candle`: also what building blockscaled-candle needs, which candle's CUDA build
# asks of a CUDA toolkit (nvcc and cicc for its kernels' PTX, the runtime and CCCL headers),
# from NVIDIA's pip packages of the same release, installed together in one `pip --target`
# (a second install into the same target would replace the first's `nvidia/` folder); and
# link-time stand-ins for the CUDA libraries candle links (scripts/cuda-link-stubs.sh). Prints
# the lines to export PATH, CUDA_ROOT, CUDA_COMPUTE_CAP (sm_90: the GPUs the tests run on) and
# LIBRARY_PATH.
if [ "${1:-}" = --candle ]; then
  cuda="$tools/cuda-toolkit-$PTXAS_VERSION"
  has_nvcc() { local v; v=$("$cuda/nvidia/cu13/bin/nvcc" --version 2>/dev/null) && grep -q "V$PTXAS_VERSION\$" <<<"$v" && [ -f "$cuda/nvidia/cu13/include/cuda_runtime.h" ]; }
  if ! has_nvcc; then
    py=$(command -v python3 || command -v python)
    rm -rf "$cuda"
    "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$cuda" \
      "nvidia-cuda-nvcc==$PTXAS_VERSION" "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cccl==13.0.85" \
      "nvidia-nvvm==$PTXAS_VERSION" "nvidia-cuda-crt==$PTXAS_VERSION" >&2
  fi
  has_nvcc || { echo "setup.sh: nvcc $PTXAS_VERSION not found in $cuda" >&2; exit 1; }
  root="$cuda/nvidia/cu13"
  echo "export PATH=$root/bin:\$PATH CUDA_ROOT=$root CUDA_COMPUTE_CAP=90"
  CUDA_ROOT=$root scripts/cuda-link-stubs.sh "$tools/cuda-link-stubs"
fi
