#!/usr/bin/env bash
# On the GPU machine: ncu metrics of the sm90 kernel for each --cluster_shape_mn given (default
# 1,1, 2,1 and 1,2: alone, pairs along M, pairs along N) on one shape (default 8192³).
cd "$(dirname "$0")"
shape=${SHAPE:-8192,8192,8192,1}
for c in "${@:-1,1 2,1 1,2}"; do
  for cc in $c; do
    echo "=== cluster $cc, $shape"
    timeout 300 ncu --clock-control none -k regex:sm90_fp8 -c 1 \
      --metrics gpu__time_duration.sum,launch__grid_size,launch__cluster_dim_x,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio \
      ./blockscaled-run --mnkl "$shape" --recipe deepseek-fp8 --skip_ref_check --no_peer --iterations 1 --warmup_iterations 0 --cluster_shape_mn "$cc" 2>&1 | grep -E "Gpu|^\s+(gpu__|launch__|sm__|lts__|smsp__)"
  done
done
