#!/usr/bin/env bash
# Runs on the GPU machine from stage/: the sm90 kernel on many shapes (not only the benchmark's)
# with each unswapped tile, alone and in pairs along N, and the heuristic's own choice, to check
# `plan::tile_cost`. One line per run: shape, forced tile and cluster (or
# "auto"), the configuration the runner reports, time (µs). A config is TILE:CLUSTER or
# TILE:CLUSTER:SPLIT_K (e.g. 64,128:1,1:2 for the swapped 64-row tile, K in two). Usage:
#   bash stage/tile-sweep.sh [extra runner args]        SHAPES="M,N,K,L ..." overrides the list
set -uo pipefail
cd "$(dirname "$0")"
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
shapes=${SHAPES:-"4096,2112,7168,1 4096,7168,2048,1 8192,8192,2048,1 2048,7168,2048,1 2048,2112,7168,1
  4096,4096,2048,1 1024,7168,7168,1 2048,24576,1536,1 4096,1536,7168,1 8192,2112,2048,1
  1536,8192,4096,1 3072,3072,4096,1 4096,5120,2048,1 6144,6144,2048,1 1024,4096,7168,1
  4096,12288,2048,1"}
configs=${CONFIGS:-"auto 256,128:1,2 192,128:1,2 128,128:1,1 128,192:1,1 128,192:1,2 128,160:1,2 128,144:1,2"}
for mnkl in $shapes; do
  for cfg in $configs; do
    args=()
    if [ "$cfg" != auto ]; then
      IFS=: read -r tile cluster split <<<"$cfg"
      args=(--mma_tiler_mn "$tile" --cluster_shape_mn "$cluster")
      [ -n "$split" ] && args+=(--split_k "$split")
    fi
    line=$(./blockscaled-run --mnkl "$mnkl" --recipe deepseek-fp8 --kernel sm90 "${args[@]}" \
      --skip_ref_check --no_peer --iterations ${ITERS:-20} --warmup_iterations 3 "$@" 2>&1 \
      | grep -E "deepseek-fp8 \(|rror" | tail -1)
    echo "$mnkl $cfg $(echo "$line" | awk '{print $1, $8}')"
  done
done
