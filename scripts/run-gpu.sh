#!/usr/bin/env bash
# Runs on the GPU machine (no Rust there): every test binary with --include-ignored, then the
# runner. Arguments are passed to the runner (default: every recipe at 2048x2048x512).
# Each step's output also goes to a log file in $OUT (when set; default /tmp/blockscaled-out).
# A test binary still running after TEST_TIMEOUT seconds (default 300) is stopped and counted as
# failed, and the others go on (a hang costs one binary, not the machine's whole call).
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/blockscaled-out}; mkdir -p "$OUT"
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
# blockscaled-candle's tests and examples link the CUDA runtime, cuBLAS, cuRAND and NVRTC (candle
# does): their directories from a CUDA install or NVIDIA's pip packages.
for lib in libcudart.so.13 libcublas.so.13 libcurand.so.10 libnvrtc.so.13; do
  l=$(find / -name "$lib" -not -path '*/proc/*' 2>/dev/null | head -1)
  [ -n "$l" ] && export LD_LIBRARY_PATH="$(dirname "$l"):${LD_LIBRARY_PATH:-}"
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
# NCCL (the tensor-parallel tests): cudarc loads `libnccl.so`; NVIDIA's pip package ships
# libnccl.so.2, so link it under that name. NVLink multicast stays off (never enable it here).
export NCCL_NVLS_ENABLE=0
nccl=$(find / -name 'libnccl.so.2' -not -path '*/proc/*' 2>/dev/null | head -1)
if [ -n "$nccl" ]; then
  mkdir -p /tmp/blockscaled-nccl && ln -sf "$nccl" /tmp/blockscaled-nccl/libnccl.so
  export LD_LIBRARY_PATH="/tmp/blockscaled-nccl:${LD_LIBRARY_PATH:-}"
fi
gpus=$(nvidia-smi -L | wc -l)
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in tests/*; do
    if [ "$(basename "$t")" = gpu_parallel ] && [ "$gpus" -lt 2 ]; then
      echo "=== $t: skipped (it needs two GPUs; this machine has $gpus)"; continue
    fi
    echo "=== $t"
    timeout "${TEST_TIMEOUT:-300}" "./$t" --include-ignored 2>&1 | tee "$OUT/$(basename "$t").log" |
      grep -E "^test result|FAILED|panicked|failed|running for over" || true
    rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] && echo "=== $t: TIMED OUT after ${TEST_TIMEOUT:-300} s (a hang? its log: $OUT/$(basename "$t").log)"
    [ "$rc" = 0 ] || status=1
  done
fi
echo "=== runner"
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(--mnkl 2048,2048,512,1 --recipe all)
./blockscaled-run "${args[@]}" 2>&1 | tee "$OUT/runner.log"; [ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
