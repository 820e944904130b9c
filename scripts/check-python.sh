#!/usr/bin/env bash
# The Python package (python/), as a user gets it: `pip install ./python` (maturin, stable Rust,
# the kernel images the crate ships: no nightly, ptxas or CUDA toolkit), its Rust linted
# (rustfmt, clippy with warnings as errors), then its tests that need no GPU (pytest; the GPU
# ones skip themselves without a device).
set -euo pipefail
cd "$(dirname "$0")/../python"
# As a user builds it: from the shipped images, whatever the repository's test run exports.
export BLOCKSCALED_BUILD_KERNELS=0
unset BLOCKSCALED_CHECK_IMAGES BLOCKSCALED_REQUIRE_PTXAS
cargo fmt --check
cargo clippy --all-targets -- -D warnings
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore pytest
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore .
# From outside the source folder, so that `import blockscaled` is the installed package.
cd tests && python3 -m pytest -q -p no:cacheprovider .
