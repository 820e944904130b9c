#!/usr/bin/env bash
# Installs what building blockscaled needs on a fresh machine: the pinned nightly toolchain with the
# components rust-toolchain.toml lists (rust-src for -Zbuild-std, llvm-tools for the PTX link), and
# ptxas from the pip package nvidia-cuda-nvcc (to assemble the PTX at build time; no CUDA install
# needed). Prints the line to export PTXAS. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup toolchain install >/dev/null   # reads rust-toolchain.toml (RUSTUP_AUTO_INSTALL may be 0)
py=$(command -v python3 || command -v python)
if ! ptxas=$(scripts/find-ptxas.sh 2>/dev/null); then
  "$py" -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvcc >&2
  ptxas=$(scripts/find-ptxas.sh)
fi
"$ptxas" --version | tail -1 >&2
echo "export PTXAS=$ptxas"
