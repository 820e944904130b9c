#!/usr/bin/env bash
# On the GPU machine, after stage-gpu.sh: compute-sanitizer's memcheck, racecheck and synccheck
# over the GPU test binaries in stage/tests, each test binary with --include-ignored, one test
# thread. Exits non-zero if any run reports an error or a hazard, or fails, or times out; prints
# one line per (tool, binary) with the sanitizer's summary.
#
# A sanitized run is 10-100× slower: BINARIES="gpu_quantize gpu_fused …" picks the binaries
# (default: every one but the two-GPU gpu_parallel), TOOLS="memcheck …" the tools, FILTER_<binary>
# a test-name filter for one (e.g. FILTER_gpu=special), LIMIT the seconds per run (default 600).
#
# memcheck also counts CUDA API calls that fail. A test that hands the crate a bad address on
# purpose makes the driver refuse it (the crate turns that into a typed error, which the test
# checks): those tests, named in API_ERRORS_<binary>, run in a second memcheck run of their own
# with API-error reporting off; every other test runs with it on.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/blockscaled-out}; mkdir -p "$OUT"
for lib in libcudart.so.13 libcublas.so.13 libcurand.so.10 libnvrtc.so.13 libcublasLt.so.13; do
  l=$(find / -name "$lib" -not -path '*/proc/*' 2>/dev/null | head -1)
  [ -n "$l" ] && export LD_LIBRARY_PATH="$(dirname "$l"):${LD_LIBRARY_PATH:-}"
done
tools=${TOOLS:-memcheck racecheck synccheck}
binaries=${BINARIES:-$(cd tests && ls | grep -v '^gpu_parallel$' | tr '\n' ' ')}
API_ERRORS_gpu_engine=${API_ERRORS_gpu_engine:-raw_addresses_run_as_views_do_and_bad_ones_are_typed_errors}
status=0
for tool in $tools; do
  for b in $binaries; do
    [ -x "tests/$b" ] || { echo "sanitize: no test binary tests/$b" >&2; status=1; continue; }
    var="FILTER_${b//-/_}"; filter=${!var:-}
    extra=(); [ "$tool" = racecheck ] && extra=(--racecheck-report hazard)
    api="API_ERRORS_${b//-/_}"; api=${!api:-}
    skip=(); [ "$tool" = memcheck ] && for t in $api; do skip+=(--skip "$t"); done
    runs=(all); [ ${#skip[@]} -gt 0 ] && runs+=(api)
    for run in "${runs[@]}"; do
      if [ "$run" = all ]; then
        log="$OUT/sanitize-$tool-$b.log"; args=("${extra[@]}"); tests_args=($filter "${skip[@]}")
      else
        log="$OUT/sanitize-$tool-$b-api.log"; args=(--report-api-errors no); tests_args=($api)
      fi
      timeout "${LIMIT:-600}" compute-sanitizer --tool "$tool" --error-exitcode 99 "${args[@]}" \
        "./tests/$b" --include-ignored --test-threads=1 "${tests_args[@]}" >"$log" 2>&1
      rc=$?
      summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
      tests=$(grep -E "^test result" "$log" | tail -1)
      name=$b; [ "$run" = api ] && name="$b (bad addresses)"
      printf "%-10s %-32s rc=%-3s %s | %s\n" "$tool" "$name" "$rc" "${summary:-no summary}" "${tests:-no test result}"
      [ "$rc" = 0 ] || status=1
    done
  done
done
exit $status
