#!/usr/bin/env bash
# On the GPU machine: the runner of another version (OLD, a staged blockscaled-run built from that
# commit) against this staged one, on a few rows of every bench set (scripts/perf-md.sh's sets),
# alternating old and new, ROUNDS rounds (default 2), each run its own process on GPU 0 of
# CUDA_VISIBLE_DEVICES; prints per row the median of each and the ratio, then the median ratio
# and the range. Rows are read from the runner's printed tables (every version prints them; the
# --json rows are newer than some versions worth comparing with).
#   bash stage/ab-runner.sh path/to/old/blockscaled-run     (OUT: where the runs' output goes)
# CASES=FILE replaces the cases below by FILE's lines (one runner argument list a line).
set -uo pipefail
old=$(realpath "${1:?usage: ab-runner.sh OLD_RUNNER}")
cd "$(dirname "$0")"
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/ab}; mkdir -p "$OUT"
ds="--recipe deepseek-fp8"
# A few rows of every bench set (scripts/perf-md.sh's sets; the sets' other rows run the same
# kernels on other shapes).
cases=(
  "--mnkl 2048,2048,512,1 --recipe all"
  "--mnkl 8192,8192,8192,1 $ds"
  "--mnkl 4096,7168,2048,1 $ds"
  "--mnkl 4096,7168,2048,1 $ds --mma_tiler_mn 192,128"
  "--mnkl 4096,7168,2048,1 $ds --mma_tiler_mn 128,160"
  "--mnkl 128,7168,2048,1 $ds"
  "--mnkl 2048,8192,28672,1 $ds"
  "--mnkl 16,24576,1536,1 $ds"
  "--mnkl 64,7168,2048,1 $ds"
  "--mnkl 4096,7168,2048,1 --recipe mxfp8-e4m3,mxfp8-e5m2,mxfp4,nvfp4,e2m1-e8m0x16"
  "--mnkl 16,14336,4096,1 --recipe mxfp4,nvfp4,w4a16-mxfp4,w4a16-nvfp4,w4a8-mxfp4,w4a8-nvfp4"
  "--mnkl 4096,4096,4096,1 --ab_dtype bf16"
  "--group_case 0"
  "--groups 41,7,63,0,22,58,12,35 --masked 256 --mnkl 1,4096,7168,1"
  "--bsr b --mnkl 4096,4096,4096,1 --density 0.1"
  "--bsr b --mnkl 4096,4096,4096,1 --density 0.1 --bsr_type bf16"
  "--mnkl 4096,7168,2048,1 $ds --epilogue bias,silu --out_quant fp8-1x128"
  "--mnkl 4096,7168,2048,1 --recipe mxfp8-e4m3 --epilogue bias,silu --out_quant mxfp8"
)
if [ -n "${CASES:-}" ]; then mapfile -t cases < "$CASES"; fi
for r in $(seq 1 "${ROUNDS:-2}"); do
  i=0
  for c in "${cases[@]}"; do
    for v in old new; do
      bin=./blockscaled-run; [ $v = old ] && bin=$old
      $bin $c --skip_ref_check --no_peer --iterations 50 --warmup_iterations 10 > "$OUT/$i-$v-$r.txt" 2>&1 || echo "FAILED: $v $c"
    done
    i=$((i + 1))
  done
done
python3 - "$OUT" "${cases[@]}" <<'PY'
import sys, re, statistics, glob
out = sys.argv[1]; cases = sys.argv[2:]
def times(path):
    # One time per row, by the row's format: fused epilogue rows, 16-bit rows, grouped rows,
    # block-sparse rows, and the dense runner's (four sizes, then the time).
    ts = []
    for line in open(path):
        m = re.match(r"^  (\S.{0,43}?)\s+([\d.]+) µs\s+[\d.]+ TFLOP/s", line)
        if m: ts.append(float(m.group(2))); continue
        m = re.search(r"\bours\s+([\d.]+) µs", line)
        if m: ts.append(float(m.group(1))); continue
        m = re.match(r"^\S+\s+(Contiguous|Masked)\s+\d+\s+\d+\s+\d+\s+\d+\s+.*?\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+\S+\s+\S+(\s*\(peer:.*\))?\s*$", line)
        if m: ts.append(float(m.group(2))); continue
        t = line.split()
        if len(t) > 8 and "/" in t[0] and t[1] in ("A", "B"):
            try: ts.append(float(t[8])); continue
            except ValueError: pass
        for i in range(len(t) - 5):
            if all(x.isdigit() for x in t[i:i+4]):
                try: ts.append(float(t[i+4])); break
                except ValueError: pass
    return ts
print(f"{'case':60s} {'old us':>9s} {'new us':>9s} {'new/old':>8s}")
ratios = []
for i, c in enumerate(cases):
    old = [times(p) for p in sorted(glob.glob(f"{out}/{i}-old-*.txt"))]
    new = [times(p) for p in sorted(glob.glob(f"{out}/{i}-new-*.txt"))]
    if not old or not new or not old[0] or len(old[0]) != len(new[0]):
        print(f"{c:60s} rows differ: {old} {new}"); continue
    for j in range(len(old[0])):
        o = statistics.median(x[j] for x in old if len(x) > j); n = statistics.median(x[j] for x in new if len(x) > j)
        ratios.append(n / o)
        print(f"{c[:58] + (' #' + str(j) if len(old[0]) > 1 else ''):60s} {o:9.1f} {n:9.1f} {n/o:8.3f}")
print(f"rows {len(ratios)}; new/old median {statistics.median(ratios):.4f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
PY
