#!/usr/bin/env bash
# On the GPU machine, after stage-gpu.sh: ncu's per-instruction warp-stall sampling (the
# SourceCounters section) of the sm90 kernel the runner launches for one shape, exported as CSV
# (one row per SASS instruction) to $OUT (default /tmp), and a summary: where the kernel's warps
# spend their samples by kind of instruction (waiting for wgmma, issuing it, promoting, barriers,
# moving descriptors, the rest), and the 25 instructions with the most samples with their top
# stall reasons. Samples count warps, so an idle warp parked at a barrier shows up too.
#   bash stage/ncu-source.sh [runner args]          (default: 4096,7168,16384 deepseek-fp8)
#   bash scripts/ncu-source.sh --summarize FILE.csv (the summary of an exported CSV, anywhere)
# NCU_KERNEL (a regex, default sm90_) picks the kernel, NCU_SKIP (default 0) how many of its
# launches to pass over first, NCU_TAG (default ncu-source) names the files.
set -uo pipefail
summarize() {
  python3 - "$1" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
hdr, data = rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]
col = {h: i for i, h in enumerate(hdr)}
S, E = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
reasons = [h for h in hdr if h.startswith("stall_") and "(Not" not in h]
num = lambda v: int(v.replace(",", "")) if v.replace(",", "").isdigit() else 0
def opcode(r):
    words = r[1].split()
    return words[1] if words and words[0].startswith("@") else (words[0] if words else "")
kinds = [("wgmma wait (DEPBAR)", lambda o: o.startswith("WARPGROUP.DEPBAR")),
         ("wgmma issue", lambda o: "GMMA" in o),
         ("promotion (FFMA)", lambda o: o == "FFMA"),
         ("mbarrier (SYNCS)", lambda o: o.startswith("SYNCS")),
         ("barriers (BAR, cluster)", lambda o: o.startswith("BAR.") or "CGABAR" in o),
         ("descriptor moves (R2UR, SHFL)", lambda o: o.startswith(("R2UR", "SHFL"))),
         ("branches, convergence", lambda o: o.startswith(("BRA", "BSSY", "BSYNC", "WARPSYNC")))]
total = sum(num(r[S]) for r in data)
print(f"samples {total}, warp instructions executed {sum(num(r[E]) for r in data)}")
left = total
for name, test in kinds:
    n = sum(num(r[S]) for r in data if test(opcode(r)))
    left -= n
    print(f"  {name:32} {n:8} {100 * n / max(total, 1):5.1f}%")
print(f"  {'other':32} {left:8} {100 * left / max(total, 1):5.1f}%")
print("top instructions: samples, executions, top stall reasons")
for r in sorted(data, key=lambda r: -num(r[S]))[:25]:
    why = sorted(((num(r[col[h]]), h[6:]) for h in reasons), reverse=True)[:3]
    print(f"  {r[0][-6:]} {r[1].strip()[:58]:58} {num(r[S]):7} {num(r[E]):9}  " +
          ", ".join(f"{w} {n}" for n, w in why if n))
EOF
}
if [ "${1:-}" = "--summarize" ]; then summarize "$2"; exit; fi
cd "$(dirname "$0")"
OUT=${OUT:-/tmp}
lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):${LD_LIBRARY_PATH:-}"
args=("$@"); [ ${#args[@]} -gt 0 ] || args=(--mnkl 4096,7168,16384,1 --recipe deepseek-fp8)
tag=${NCU_TAG:-ncu-source}
timeout 300 ncu --clock-control none -k "regex:${NCU_KERNEL:-sm90_}" --launch-skip "${NCU_SKIP:-0}" -c 1 --section SourceCounters --section WarpStateStats \
  --section SpeedOfLight --import-source no -f -o "$OUT/$tag" \
  ./blockscaled-run "${args[@]}" --skip_ref_check --no_peer --iterations 1 --warmup_iterations 0 2>&1 | tail -2
ncu -i "$OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/$tag.csv" || exit 1
ncu -i "$OUT/$tag.ncu-rep" --page details --csv > "$OUT/$tag-details.csv"
python3 - "$OUT/$tag-details.csv" <<'EOF'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r.get("Metric Name") in ("Duration", "SM Frequency", "Compute (SM) Throughput"):
        print(f'{r["Kernel Name"]}: {r["Metric Name"]} {r["Metric Value"]} {r["Metric Unit"]}')
EOF
summarize "$OUT/$tag.csv"
