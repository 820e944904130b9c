#!/usr/bin/env bash
# Builds the GPU test binary from HEAD with a planted 0.5% error in the sm90 kernel — every
# promoted partial sum multiplied by 1.005 in `gemm/promote.rs` (what a bf16-rounded scale or a
# slightly wrong tensor scale does) — into stage-planted/ (git-ignored), to show which GPU checks
# see such an error. On the GPU machine:
#   stage-planted/gpu --include-ignored sm90_kernel_has_no_systematic_error   # must FAIL
#   stage-planted/gpu --include-ignored sm90_kernel_matches_cpu_reference_on_random_ragged_shapes
#     (random signs: passes — the blind spot the no-cancellation check closes)
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
export BLOCKSCALED_REQUIRE_PTXAS=1
src=target/planted/src
rm -rf "$src" && mkdir -p "$src"
git archive HEAD | tar -x -C "$src"
f="$src/kernels/src/gemm/promote.rs"
sed -i 's|let f = if (i / 2) % 2 == 0 { f0 } else { f1 };|let f = 1.005 * if (i / 2) % 2 == 0 { f0 } else { f1 };|' "$f"
grep -q "1.005 \*" "$f" || { echo "plant-error.sh: the promotion line was not found in $f" >&2; exit 1; }
json=$(cd "$src" && CARGO_TARGET_DIR="$PWD/../target" cargo test --release -p blockscaled-tests \
  --test gpu --no-run --message-format=json 2>/dev/null)
exe=$(echo "$json" | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu":
        print(m["executable"])')
rm -rf stage-planted && mkdir -p stage-planted
cp "$exe" stage-planted/gpu && strip stage-planted/gpu
ls -la stage-planted
