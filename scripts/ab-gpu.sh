#!/usr/bin/env bash
# On the GPU machine: the cargo-bench table (BLOCKSCALED_BENCH, default all) of two staged builds,
# A then B, then A and B again, each in its own process — "same speed" checks between versions.
#   bash stage/ab-gpu.sh stage-base stage        (folders that hold a bench-gemm)
# Tables go to stdout and to $OUT/ab-<name>-<round>.txt when OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
a=${1:?usage: ab-gpu.sh DIR_A DIR_B}; b=${2:?usage: ab-gpu.sh DIR_A DIR_B}
rounds=${ROUNDS:-2}
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
status=0
for r in $(seq 1 "$rounds"); do
  for d in "$a" "$b"; do
    echo "=== $d, round $r"
    log=/dev/null; [ -n "${OUT:-}" ] && log="$OUT/ab-$(basename "$d")-$r.txt"
    "$d/bench-gemm" --bench 2>&1 | tee "$log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
done
exit $status
