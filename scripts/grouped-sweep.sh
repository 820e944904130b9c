#!/usr/bin/env bash
# Runs on the GPU machine from stage/: the grouped FP8 kernel on prefill-sized groups (and the
# seed's MoE cases) with each tile, band height and cluster the plan could choose, the plan's own
# choice, and for the prefill cases the dense kernel on the same rows with the same forced
# configuration (what the groups cost beyond the configuration), for fitting the grouped rule
# (`sm90_grouped_default`). One line per run: case, grouped or dense, forced configuration (or
# "auto"), the runner's line (plan, µs). Usage:
#   bash stage/grouped-sweep.sh [extra runner args]
# CASES="GROUPS:N,K ..." overrides the cases (GROUPS a comma list of rows per group, or seedI for
# the seed's case I); CONFIGS="TILE:CLUSTER:BAND ..." the configurations (any field may be empty:
# the plan's).
set -uo pipefail
cd "$(dirname "$0")"
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '*/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
cases=${CASES:-"759,249,651,385,898,320,510,324:14336,4096
  1517,498,1302,771,1795,640,1021,648:14336,4096 seed1: seed2: seed3: seed4:"}
configs=${CONFIGS:-"auto 128,128:1,1:1 128,128:1,1:8 128,128:1,2:8 128,128:2,1:4
  256,128:1,1:4 256,128:1,2:4 256,128:2,1:2 192,128:1,2:4"}
for c in $cases; do
  groups=${c%%:*}; nk=${c#*:}
  if [[ $groups == seed* ]]; then
    what=(--group_case "${groups#seed}")
  else
    rows=$(echo "$groups" | tr ',' '\n' | awk '{s += $1} END {print s}')
    what=(--groups "$groups" --mnkl "$rows,$nk,1")
  fi
  for cfg in $configs; do
    args=()
    if [ "$cfg" != auto ]; then
      IFS=: read -r tile cluster band <<<"$cfg"
      [ -n "$tile" ] && args+=(--mma_tiler_mn "$tile")
      [ -n "$cluster" ] && args+=(--cluster_shape_mn "$cluster")
      [ -n "$band" ] && args+=(--group_m "$band")
    fi
    ./blockscaled-run "${what[@]}" --recipe deepseek-fp8 "${args[@]}" --no_peer \
      --iterations ${ITERS:-30} "$@" 2>&1 | grep -E "^deepseek-fp8|rror" |
      awk -v c="$groups" -v f="$cfg" '{print c, "grouped", f, $0}'
    [[ $groups == seed* ]] && continue
    ./blockscaled-run --mnkl "$rows,$nk,1" --recipe deepseek-fp8 --kernel sm90 "${args[@]}" \
      --skip_ref_check --no_peer --iterations ${ITERS:-30} "$@" 2>&1 |
      grep -E "deepseek-fp8 \(|rror" | awk -v c="$groups" -v f="$cfg" '{print c, "dense", f, $0}'
  done
done
