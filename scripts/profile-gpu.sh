#!/usr/bin/env bash
# On the GPU machine, after stage-gpu.sh: compute-sanitizer (memcheck, racecheck, synccheck) on
# small ragged shapes of the sm90 kernel, then an ncu summary of one 8192³ launch.
set -uo pipefail
cd "$(dirname "$0")"
run=./blockscaled-run
small=(--recipe deepseek-fp8 --iterations 1 --warmup_iterations 0 --no_peer)
# 200×136 (N % 8 == 0: the TMA-store epilogue) and 200×100 f32 (direct stores), every tile, alone
# and in pairs along M and along N. TILES="..." and CLUSTERS="..." pick (default: all).
# SANITIZE=0 skips the sanitizer runs; NCU=1 adds the ncu summary of 8192³ deepseek-fp8: the sm90
# kernel the heuristic picks and, in the same ncu run, cuBLASLt's kernel for the same GEMM (PEER=0:
# ours only). ncu works on the runner since its timing skips the stream gate under a profiler
# (benches/src/timing.rs).
tools="memcheck racecheck synccheck"; [ "${SANITIZE:-1}" = 0 ] && tools=""
for tool in $tools; do
  for case in "200,136,512,2 BFloat16" "200,100,256,1 Float32"; do set -- $case
  for tile in ${TILES:-128,128 192,128 256,128 128,64 128,144 128,160 128,192}; do for cl in ${CLUSTERS:-1,1 2,1 1,2}; do
    [ "$tile,$cl" = "128,64,2,1" ] && continue   # 64-column tiles do not pair along M
    printf "%-10s %-14s %-8s %-8s %-4s " "$tool" "$1" "$2" "$tile" "$cl"
    timeout 300 compute-sanitizer --tool "$tool" "$run" --mnkl "$1" --c_dtype "$2" --mma_tiler_mn "$tile" --cluster_shape_mn "$cl" "${small[@]}" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|mismatch|FAIL" | tr '\n' ' '
    echo
  done; done; done
done
[ "${NCU:-0}" = 1 ] || exit 0   # the ncu summary only with NCU=1
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
peer=(); kernels="sm90_fp8|nvjet|xmma|cutlass|gemm"; count=4
[ "${PEER:-1}" = 0 ] && { peer=(--no_peer); kernels="sm90_fp8"; count=1; }
stalls=$(for r in barrier long_scoreboard wait math_pipe_throttle membar short_scoreboard dispatch_stall \
  sleeping selected not_selected no_instruction mio_throttle lg_throttle branch_resolving drain misc; do
  printf "smsp__average_warp_latency_issue_stalled_%s.ratio," "$r"; done)
# Tensor pipe: sm__pipe_tensor_op_gmma_cycles_active read "n/a" for both kernels with ncu 2025.3.1
# on the H100 (2026-11-23); sm__pipe_tensor_cycles_active (the MMA pipe, wgmma included) is added
# where this ncu lists it, since an unknown metric name would fail the whole run.
tensor=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
ncu --query-metrics --chip gh100 2>/dev/null | grep -q "^sm__pipe_tensor_cycles_active " &&
  tensor+=,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed
what="the sm90 kernel the heuristic picks, then cuBLASLt's kernel for the same GEMM"
[ "${PEER:-1}" = 0 ] && what="the sm90 kernel the heuristic picks"
echo "=== ncu 8192^3 deepseek-fp8: $what (raw output: ${OUT:-/tmp}/ncu-8192.log)"
timeout 300 ncu --clock-control none -k "regex:$kernels" -c "$count" \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__cluster_dim_x,launch__cluster_dim_y,launch__registers_per_thread,$tensor,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__memory_throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,${stalls%,} \
  "$run" --mnkl 8192,8192,8192,1 --recipe deepseek-fp8 --skip_ref_check "${peer[@]}" --iterations 1 --warmup_iterations 0 2>&1 \
  | tee "${OUT:-/tmp}/ncu-8192.log" | grep -vE "^==PROF== Profiling|^\s*(Warning: Data collection|-+ -+)" | grep -E "^==|^\s+[a-zA-Z_]|^Gpu|^deepseek"
