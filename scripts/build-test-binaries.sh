#!/usr/bin/env bash
# Builds the named GPU test binaries of blockscaled-tests in release (with the caller's
# environment: CARGO_TARGET_DIR, BLOCKSCALED_PLANT, BLOCKSCALED_BUILD_KERNELS, …) and copies
# them, stripped, into DIR under their test names; fails if one was not built.
#   scripts/build-test-binaries.sh DIR gpu gpu_mx ...
set -euo pipefail
dir=${1:?usage: build-test-binaries.sh DIR TEST...}; shift
[ $# -gt 0 ] || { echo "build-test-binaries.sh: no test named" >&2; exit 2; }
cd "$(dirname "$0")/.."
tests=(); for b in "$@"; do tests+=(--test "$b"); done
mkdir -p "$dir"
cargo test --release -p blockscaled-tests "${tests[@]}" --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys, shutil
dir, want = sys.argv[1], sys.argv[2:]
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in want:
        shutil.copy(m["executable"], "%s/%s" % (dir, m["target"]["name"]))
' "$dir" "$@"
for b in "$@"; do
  [ -x "$dir/$b" ] || { echo "build-test-binaries.sh: $b was not built into $dir" >&2; exit 1; }
  strip "$dir/$b"
done
