#!/usr/bin/env bash
# On the GPU machine, after stage-gpu.sh: compute-sanitizer (memcheck, racecheck, synccheck) on
# small ragged shapes of the sm90 kernel, then an ncu summary of one 8192³ launch.
set -uo pipefail
cd "$(dirname "$0")"
run=./blockscaled-run
small=(--recipe deepseek-fp8 --iterations 1 --warmup_iterations 0 --no_peer)
# 200×136 (N % 8 == 0: the TMA-store epilogue) and 200×100 f32 (direct stores), every tile, alone
# and in pairs along M and along N. TILES="..." and CLUSTERS="..." pick (default: all).
# SANITIZE=0 skips the sanitizer runs; NCU=1 adds the ncu summary (off by default:
# ncu 2025.3.1 on the lent H100s has failed on every sm90 launch with "Unknown Error", docs/PERF.md).
tools="memcheck racecheck synccheck"; [ "${SANITIZE:-1}" = 0 ] && tools=""
for tool in $tools; do
  for case in "200,136,512,2 BFloat16" "200,100,256,1 Float32"; do set -- $case
  for tile in ${TILES:-128,128 192,128 256,128 128,64}; do for cl in ${CLUSTERS:-1,1 2,1 1,2}; do
    [ "$tile,$cl" = "128,64,2,1" ] && continue   # 64-column tiles do not pair along M
    printf "%-10s %-14s %-8s %-8s %-4s " "$tool" "$1" "$2" "$tile" "$cl"
    timeout 300 compute-sanitizer --tool "$tool" "$run" --mnkl "$1" --c_dtype "$2" --mma_tiler_mn "$tile" --cluster_shape_mn "$cl" "${small[@]}" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|mismatch|FAIL" | tr '\n' ' '
    echo
  done; done; done
done
[ "${NCU:-0}" = 1 ] || exit 0   # the ncu summary only with NCU=1
echo "=== ncu 8192^3 (the sm90 kernel the heuristic picks)"
timeout 300 ncu --clock-control none -k regex:sm90_fp8 -c 1 \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,sm__memory_throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_dispatch_stall.ratio,smsp__average_warp_latency_issue_stalled_sleeping.ratio,gpu__time_duration.sum \
  "$run" --mnkl 8192,8192,8192,1 --recipe deepseek-fp8 --skip_ref_check --no_peer --iterations 1 --warmup_iterations 0 2>&1 | grep -E "^\s+(sm__|lts__|dram__|smsp__|gpu__)"
