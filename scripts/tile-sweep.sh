#!/usr/bin/env bash
# Runs on the GPU machine from stage/: the sm90 kernel at the issue's DeepSeek shapes with each
# tile height (and the heuristic's choice), cuBLASLt timed in the same process. Usage:
#   bash stage/tile-sweep.sh [extra runner args]
set -uo pipefail
cd "$(dirname "$0")"
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
for mnkl in 8192,8192,8192,1 8192,8192,1024,1 4096,7168,16384,1 4096,4096,7168,1 \
            4096,7168,2048,1 4096,2112,7168,1 4096,24576,1536,1 4096,32768,512,1; do
  for tile in 128,128 192,128 256,128; do
    ./blockscaled-run --mnkl $mnkl --recipe deepseek-fp8 --kernel sm90 --mma_tiler_mn $tile \
      --skip_ref_check --iterations 30 "$@" 2>&1 | grep -vE "^Gpu|^$" | tail -n +1
  done
done
