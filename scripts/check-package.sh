#!/usr/bin/env bash
# `cargo package` of every published crate of the workspace (blockscaled-kernels,
# blockscaled-builder, blockscaled), each verified by building the packaged sources as a registry
# user would (blockscaled from its shipped kernel images), and each .crate's size checked against
# crates.io's limit (10 MiB compressed). Prints the sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT=$((10 * 1024 * 1024))
crates=(blockscaled-kernels blockscaled-builder blockscaled)
# The package's build uses the images it ships, as it will on a user's machine: not this
# repository's kernels/ (which a package does not contain).
export BLOCKSCALED_BUILD_KERNELS=0
args=(); for c in "${crates[@]}"; do args+=(-p "$c"); done
# Verification builds the packaged crates as registry crates in this target dir, and cargo never
# rebuilds a registry crate it has built at the same version: drop those artifacts, or a second
# run verifies against the first run's sources.
find target/debug/.fingerprint -maxdepth 1 \( -name 'blockscaled-kernels-*' -o -name 'blockscaled-builder-*' \) -exec rm -rf {} + 2>/dev/null || true
# Cargo also keeps a registry crate's extracted sources (and its .crate) in CARGO_HOME and never
# extracts the same version again: drop those of the packaged crates' local registry too.
home=${CARGO_HOME:-$HOME/.cargo}
rm -rf "$home"/registry/src/*/blockscaled-kernels-* "$home"/registry/src/*/blockscaled-builder-* \
  "$home"/registry/cache/*/blockscaled-kernels-* "$home"/registry/cache/*/blockscaled-builder-* \
  2>/dev/null || true
# --allow-dirty: CI packages a clean clone; a developer may run this before committing.
cargo package "${args[@]}" --allow-dirty 2>&1 | grep -E '^ *(Packaged|Packaging|Verifying|error)' >&2
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
status=0
for c in "${crates[@]}"; do
  f=target/package/$c-$version.crate
  size=$(stat -c %s "$f")
  unpacked=$(tar -tvzf "$f" | awk '{s += $3} END {print s}')
  printf 'package %-22s %9d bytes (%.2f MiB; %.1f MiB unpacked; limit 10 MiB)\n' \
    "$c" "$size" "$(echo "$size / 1048576" | bc -l)" "$(echo "$unpacked / 1048576" | bc -l)"
  if [ "$size" -gt "$LIMIT" ]; then
    echo "check-package.sh: $f is over crates.io's 10 MiB limit" >&2
    status=1
  fi
done
exit $status
