#!/usr/bin/env bash
# Runs on the GPU machine from stage/: the sm90 kernel's swapped decode tiles on the DeepSeek-V3
# (N, K) pairs at each split of K, and the heuristic's own choice, for checking the decode cost
# model (host/src/plan.rs, `decode_split`) against measurement. Usage:
#   bash stage/decode-sweep.sh [M values, default "16 64"] [splits, default "1 2 3 4 6 8"]
set -uo pipefail
cd "$(dirname "$0")"
ms=${1:-"16 64"}; splits=${2:-"1 2 3 4 6 8"}
for m in $ms; do
  if [ "$m" -le 16 ]; then rows=16; elif [ "$m" -le 32 ]; then rows=32; else rows=64; fi
  for nk in 2112,7168 24576,1536 32768,512 7168,16384 4096,7168 7168,2048; do
    for s in $splits auto; do
      force=(--mma_tiler_mn "$rows,128" --split_k "$s")
      [ "$s" = auto ] && force=()
      printf '%s split %s: ' "$m,$nk" "$s"
      ./blockscaled-run --mnkl "$m,$nk,1" --recipe deepseek-fp8 --kernel sm90 "${force[@]}" \
        --skip_ref_check --no_peer --iterations 50 2>&1 | grep -v "^$" | tail -1
    done
  done
done
