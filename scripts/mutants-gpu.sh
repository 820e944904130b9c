#!/usr/bin/env bash
# Mutation testing of the host code only the GPU reaches (launches, device-buffer accessors,
# kernel parameters, epilogue checks). cargo-mutants runs the CPU tests; the mutants they miss are
# given here, each is built into the GPU test binaries that cover its file, and run.sh runs them on
# the GPU machine: a mutant is caught when a binary fails or times out.
#   here:     scripts/mutants-gpu.sh MISSED.txt...   (cargo-mutants' missed.txt; ~15 s a mutant)
#             -> stage-mutants/{base,m1,m2,...}/<test binary>, mutants.tsv, run.sh
#   GPU box:  bash stage-mutants/run.sh               (JOBS in parallel, LIMIT seconds a run)
# The unmutated binaries (base/) run first and must pass, or no mutant's result means anything.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: scripts/mutants-gpu.sh MISSED.txt..." >&2; exit 2; }
eval "$(scripts/setup.sh)" >/dev/null
export BLOCKSCALED_BUILD_KERNELS=0 CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/mutants}
# The GPU test binaries that cover each file.
declare -A binaries=(
  [host/src/bsr.rs]="gpu_bsr gpu_half"
  [host/src/fused.rs]="gpu_fused"
  [host/src/grouped.rs]="gpu_grouped gpu_moe"
  [host/src/plan/mod.rs]="gpu gpu_mx gpu_engine"
  [host/src/families/heuristic.rs]="gpu gpu_half"
)
out=stage-mutants
rm -rf "$out" && mkdir -p "$out"
missed=$(cat "$@" | sort -u)
files=$(echo "$missed" | cut -d: -f1 | sort -u)
for f in $files; do
  [ -n "${binaries[$f]:-}" ] || { echo "mutants-gpu.sh: no GPU tests named for $f" >&2; exit 2; }
  git diff --quiet -- "$f" || { echo "mutants-gpu.sh: $f has uncommitted changes" >&2; exit 2; }
done
list=$(mktemp); trap 'rm -f "$list"' EXIT
cargo mutants -p blockscaled $(for f in $files; do echo --file "$f"; done) --list --json --diff >"$list"

# build DIR FILE: the GPU test binaries covering FILE, stripped, into DIR.
build() { scripts/build-test-binaries.sh "$1" ${binaries[$2]}; }

for f in $files; do build "$out/base" "$f"; done
i=0
while IFS= read -r name; do
  [ -n "$name" ] || continue
  i=$((i + 1)); f=${name%%:*}
  diff=$(python3 -c '
import json, sys
for m in json.load(open(sys.argv[1])):
    if m["name"] == sys.argv[2]: print(m["diff"]); break
' "$list" "$name")
  [ -n "$diff" ] || { echo "mutants-gpu.sh: not a mutant of this tree: $name" >&2; exit 1; }
  echo "[$i] $name"
  echo "$diff" | patch -s "$f"
  ok=1; build "$out/m$i" "$f" || ok=0
  echo "$diff" | patch -s -R "$f"
  [ $ok = 1 ] || { echo "unviable" >"$out/m$i/unviable"; }
  printf "m%s\t%s\t%s\n" "$i" "${binaries[$f]}" "$name" >>"$out/mutants.tsv"
done <<<"$missed"
git diff --quiet -- $files || { echo "mutants-gpu.sh: a mutant was left in the tree" >&2; exit 1; }

cat >"$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# On the GPU machine: the base binaries must pass; each mutant is caught when one of its binaries
# fails or runs past LIMIT seconds. Prints one line per mutant and a count; exits non-zero when the
# base fails. Logs under OUT.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/mutants}; mkdir -p "$OUT"
for lib in libcublasLt.so.13 libcublas.so.13; do
  l=$(find / -name "$lib" -not -path '*/proc/*' 2>/dev/null | head -1)
  [ -n "$l" ] && export LD_LIBRARY_PATH="$(dirname "$l"):${LD_LIBRARY_PATH:-}"
done
for b in base/*; do
  "./$b" --include-ignored -q >"$OUT/base-$(basename "$b").log" 2>&1 ||
    { echo "BASE FAILS: $b (see $OUT/base-$(basename "$b").log)"; exit 1; }
done
echo "base: every binary passes"
one() {  # one mutant: caught / missed / timeout
  local id=$1 bins=$2 r=missed b rc
  [ -e "$id/unviable" ] && { echo unviable >"$OUT/$id.result"; return; }
  for b in $bins; do
    timeout "${LIMIT:-180}" "./$id/$b" --include-ignored -q >"$OUT/$id-$b.log" 2>&1; rc=$?
    if [ $rc = 124 ]; then r=timeout; break; elif [ $rc != 0 ]; then r="caught by $b"; break; fi
  done
  echo "$r" >"$OUT/$id.result"
}
export -f one; export OUT
cut -f1,2 mutants.tsv | xargs -P "${JOBS:-4}" -L1 bash -c 'one "$0" "$1 $2 $3"'
while IFS=$'\t' read -r id bins name; do
  printf "%-16s %s\n" "$(cat "$OUT/$id.result")" "$name"
done <mutants.tsv
for r in caught timeout missed unviable; do
  printf "%s: %s  " "$r" "$(cat "$OUT"/m*.result | grep -c "^$r")"
done; echo
RUN
du -sh "$out"
