#!/usr/bin/env bash
# Shows that the GPU tests catch a 0.5% systematic error wherever one could hide. For each site of
# `blockscaled_kernels::plant` (the FP8 promotion, the fold, the MX, 4-bit-weights and 16-bit
# kernels' scaling of their products, the fused epilogue), builds the GPU test binaries that cover
# it with BLOCKSCALED_PLANT=<site> (the kernels compiled with that site's factor 1.005 instead of
# 1; the source is not edited) into stage-planted/<site>/, beside plant-check.sh, which runs them
# on the GPU machine and exits non-zero unless every planted build fails its tests.
#   here:     scripts/plant-error.sh [SITE...]     (default every site; a few minutes each)
#   GPU box:  bash stage-planted/plant-check.sh    (OUT: where the logs go)
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
export BLOCKSCALED_REQUIRE_PTXAS=1 BLOCKSCALED_BUILD_KERNELS=1
# The site's tests: the no-cancellation checks of every binary whose kernels the site touches.
declare -A binaries=(
  [promote]="gpu gpu_grouped gpu_bsr gpu_mx"
  [fold]="gpu_mx gpu_grouped"
  [mx]="gpu_mx"
  [w4]="gpu_w4"
  [half]="gpu_half"
  [fused]="gpu_fused"
)
sites=("$@"); [ ${#sites[@]} -gt 0 ] || sites=(promote fold mx w4 half fused)
rm -rf stage-planted && mkdir -p stage-planted
for site in "${sites[@]}"; do
  [ -n "${binaries[$site]:-}" ] || { echo "plant-error.sh: unknown site $site" >&2; exit 2; }
  echo "== $site: ${binaries[$site]}"
  # One target folder for every site: only the kernels, the host crate and the tests rebuild.
  BLOCKSCALED_PLANT=$site CARGO_TARGET_DIR=target/planted \
    scripts/build-test-binaries.sh "stage-planted/$site" ${binaries[$site]}
done
cat > stage-planted/plant-check.sh <<'CHECK'
#!/usr/bin/env bash
# On the GPU machine: every planted build's no-cancellation tests must fail (the error caught);
# exits non-zero when one passes.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/plant}; mkdir -p "$OUT"
status=0
for site in */; do
  site=${site%/}
  for b in "$site"/*; do
    log="$OUT/$site-$(basename "$b").log"
    if "./$b" --include-ignored no_systematic_error >"$log" 2>&1; then
      echo "NOT CAUGHT: $site, $(basename "$b") passes with the error planted"; status=1
    elif grep -q "planted error\|outside\|mean deviation" "$log"; then
      echo "caught: $site, $(basename "$b"): $(grep -m1 -o "mean deviation [^ ]* outside[^,]*\|[0-9]* of [0-9]* elements outside[^:]*" "$log" | head -1)"
    else
      echo "FAILED OTHERWISE: $site, $(basename "$b") (see $log)"; status=1
    fi
  done
done
exit $status
CHECK
du -sh stage-planted
