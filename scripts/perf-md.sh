#!/usr/bin/env bash
# Runs on the GPU machine from the staged folder (after scripts/stage-gpu.sh; no Rust there): the
# standard bench sets through the staged runner, each run appending its rows to one JSON Lines
# file (`blockscaled-run --json`), then the staged generator on that file:
#   $OUT/perf.jsonl   the rows (one JSON object a line)
#   $OUT/perf-runs.log   the runners' printed output
#   $OUT/PERF.md   the tables; also written to ../docs/PERF.md when the staged folder sits in a
#                  checkout (copy $OUT/PERF.md to docs/PERF.md otherwise)
# Usage: bash stage/perf-md.sh [SET...]  (default: all sets but `multi`, which runs where there
# are two GPUs). Sets: seed deepseek decode mx w4 half grouped bsr fused quantize moe engine multi.
# The sets follow `cargo bench`'s (benches/benches/gemm.rs) and the seeds' runs: each run is a
# process of its own (start-up and the ceilings' measurement, a few seconds), decode sizes at M = 1,
# 16 and 64, block-sparse at a few densities. All of them take about 13 minutes on two H200s
# (seed to grouped about 11, the rest 2): where one call is limited to 10 minutes, run them in two
# (`perf-md.sh seed deepseek decode mx w4 half`, then `APPEND=1 perf-md.sh grouped bsr fused
# quantize moe engine multi`; APPEND=1 keeps the rows already in $OUT/perf.jsonl). ITERS sets
# --iterations (default 20); a run past TIMEOUT seconds (default 120) is stopped and counted as
# failed, and the others go on. SUSTAINED=1 times every row under sustained load (1,000 launches
# before each timing, `blockscaled-run --sustained`); run a set once without it and once with it
# (APPEND=1) and the tables show both times side by side.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/blockscaled-out}; mkdir -p "$OUT"
jsonl="$OUT/perf.jsonl"; log="$OUT/perf-runs.log"
[ "${APPEND:-0}" = 1 ] || rm -f "$jsonl" "$log"
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
# NCCL for `multi` (as run-gpu.sh): NVIDIA's pip package ships libnccl.so.2, cudarc loads
# libnccl.so. NVLink multicast stays off.
export NCCL_NVLS_ENABLE=0
nccl=$(find / -name 'libnccl.so.2' -not -path '/proc/*' 2>/dev/null | head -1)
if [ -n "$nccl" ]; then
  mkdir -p /tmp/blockscaled-nccl && ln -sf "$nccl" /tmp/blockscaled-nccl/libnccl.so
  export LD_LIBRARY_PATH="/tmp/blockscaled-nccl:${LD_LIBRARY_PATH:-}"
fi
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
sets=("$@")
if [ ${#sets[@]} = 0 ]; then
  sets=(seed deepseek decode mx w4 half grouped bsr fused quantize moe engine)
  [ "$gpus" -ge 2 ] && sets+=(multi)
fi
start=$SECONDS; runs=0; failed=0
# One runner process: its rows into $jsonl, its output into $log.
run() {
  runs=$((runs + 1))
  printf '%4ds  %s\n' $((SECONDS - start)) "$*"
  echo "=== blockscaled-run $*" >>"$log"
  if ! timeout "${TIMEOUT:-120}" ./blockscaled-run "$@" --iterations "${ITERS:-20}" --seed 1 \
      $([ "${SUSTAINED:-0}" = 1 ] && echo --sustained) --json "$jsonl" >>"$log" 2>&1; then
    failed=$((failed + 1)); echo "      FAILED (see $log)"
  fi
}
fast=(--skip_ref_check)
deepseek_nk="2112,7168 24576,1536 32768,512 7168,16384 4096,7168 7168,2048"
for set in "${sets[@]}"; do case $set in
  seed)
    run --mnkl 2048,2048,512,1 --recipe all "${fast[@]}"
    run --mnkl 8192,8192,1024,1 --recipe deepseek-fp8 "${fast[@]}"
    run --mnkl 8192,8192,8192,1 --recipe deepseek-fp8 "${fast[@]}"
    run --mnkl 8192,8192,1024,1 --ab_dtype Float4E2M1FN --sf_dtype Float8E8M0FNU --sf_vec_size 16 \
      --c_dtype Float16 "${fast[@]}" ;;
  deepseek)
    for m in 128 4096; do for nk in $deepseek_nk; do
      run --mnkl "$m,$nk,1" --recipe deepseek-fp8 "${fast[@]}"
    done; done ;;
  decode)
    for m in 1 16 64; do for nk in $deepseek_nk; do
      run --mnkl "$m,$nk,1" --recipe deepseek-fp8 "${fast[@]}"
    done; done ;;
  mx)
    for mnk in 8192,8192,8192 4096,7168,2048 4096,2112,7168 4096,24576,1536; do
      run --mnkl "$mnk,1" --recipe mxfp8-e4m3,mxfp8-e5m2,mxfp4,nvfp4,e2m1-e8m0x16 "${fast[@]}"
    done ;;
  w4)
    for m in 1 16 128; do for nk in 7168,4096 4096,7168 14336,4096; do
      run --mnkl "$m,$nk,1" --recipe mxfp4,nvfp4,w4a16-mxfp4,w4a16-nvfp4,w4a8-mxfp4,w4a8-nvfp4 \
        "${fast[@]}"
    done; done
    # Prefill sizes: W4A8 with e8m0 scales on FP8 tensor cores, against the FP8 block-wise kernel
    # (the deepseek set's row of the same shape).
    for mnk in 4096,7168,2048 2048,7168,4096; do
      run --mnkl "$mnk,1" --recipe w4a16-mxfp4,w4a8-mxfp4,w4a8-nvfp4 "${fast[@]}"
    done ;;
  half)
    run --mnkl 4096,4096,4096,1 --ab_dtype bf16 "${fast[@]}"
    run --mnkl 8192,8192,8192,1 --ab_dtype bf16 "${fast[@]}"
    run --mnkl 4096,4096,4096,1 --ab_dtype f16 "${fast[@]}" ;;
  grouped)
    run --group_case 0
    run --group_case 0 --recipe w4a8-mxfp4
    run --group_case 0 --recipe w4a8-mxfp4 --kernel exact
    run --group_case 0 --recipe w4a8-mxfp4 --fold_weights
    run --group_case 0 --recipe nvfp4
    run --group_case 0 --recipe nvfp4 --fold_weights
    # MXFP4 experts with MXFP4 activations: the activations folded per call onto the
    # 4-bit-weights kernel's FP8 MMAs (the plan), against both operands folded per call.
    run --group_case 0 --recipe mxfp4
    run --group_case 0 --recipe mxfp4 --kernel sm90mxfp8
    # Prefill with large, uneven groups (Mixtral-like: 8 experts, N = 14336, K = 4096), 4096 rows
    # and their top-2 8192.
    run --groups 759,249,651,385,898,320,510,324 --mnkl 4096,14336,4096,1 --recipe deepseek-fp8
    run --groups 1517,498,1302,771,1795,640,1021,648 --mnkl 8192,14336,4096,1 --recipe deepseek-fp8
    # Equal groups of 576 rows: two whole 256-row tiles and a quarter-live last one each (3 M
    # tiles a group, a divisor of the 66 clusters: where the units land decides the time).
    run --groups 576,576,576,576,576,576,576,576 --mnkl 4608,14336,4096,1 --recipe deepseek-fp8
    # Masked decode: G = 8 and 32 groups of up to 64 rows each, capacity 256.
    for g in 41,7,63,0,22,58,12,35 \
      9,44,0,61,27,3,50,18,33,64,5,29,47,11,56,2,38,24,60,15,0,42,8,53,20,31,46,14,63,26,6,37; do
      for nk in 4096,7168 7168,2048; do run --groups "$g" --masked 256 --mnkl "1,$nk,1"; done
    done ;;
  bsr)
    for d in 0.1 0.5; do run --bsr b --mnkl 4096,4096,4096,1 --density "$d" "${fast[@]}"; done
    run --bsr b --mnkl 8192,8192,8192,1 --density 0.1 "${fast[@]}"
    run --bsr b --mnkl 4096,4096,4096,1 --density 0.25 --pattern banded "${fast[@]}"
    run --bsr a --mnkl 4096,4096,4096,1 --density 0.1 "${fast[@]}"
    run --bsr b --mnkl 4096,4096,4096,1 --density 0.1 --bsr_type bf16 "${fast[@]}"
    run --bsr b --mnkl 4096,4096,4096,1 --density 0.1 --bsr_type bf16 --bsr_block 64 "${fast[@]}"
    run --bsr b --mnkl 4096,4096,4096,1 --density 0.1 --bsr_type f16 "${fast[@]}" ;;
  fused)
    run --mnkl 4096,7168,2048,1 --recipe deepseek-fp8 --epilogue bias,silu
    run --mnkl 4096,7168,2048,1 --recipe deepseek-fp8 --epilogue bias,silu --out_quant fp8-1x128
    run --mnkl 4096,2112,7168,1 --recipe deepseek-fp8 --epilogue bias,silu
    run --mnkl 4096,7168,2048,1 --recipe mxfp8-e4m3 --epilogue bias,silu --out_quant mxfp8 ;;
  quantize)
    for m in 4096 16; do
      run --quantize bf16 --mnkl "$m,1,7168,1" --recipe deepseek-fp8,mxfp8-e4m3,mxfp4,nvfp4
    done ;;
  moe) run --moe ;;
  engine) run --engine ;;
  multi)
    if [ "$gpus" -ge 2 ]; then run --tp; run --ep
    else echo "multi: skipped (it needs two GPUs; this machine has $gpus)"; fi ;;
  *) echo "unknown set \`$set\`: want seed deepseek decode mx w4 half grouped bsr fused quantize moe engine multi" >&2
     exit 2 ;;
esac; done
echo "$runs runs ($failed failed) in $((SECONDS - start)) s; $(wc -l <"$jsonl" 2>/dev/null || echo 0) rows in $jsonl"
[ -s "$jsonl" ] || { echo "no rows: PERF.md not written" >&2; exit 1; }
./blockscaled-perf-table "$jsonl" --out "$OUT/PERF.md" || exit 1
echo "wrote $OUT/PERF.md"
if [ -d ../docs ]; then cp "$OUT/PERF.md" ../docs/PERF.md && echo "wrote $(cd ../docs && pwd)/PERF.md"; fi
[ "$failed" = 0 ]
