#!/usr/bin/env bash
# DeepGEMM built from source and timed beside blockscaled's runner in one run: the large DeepSeek
# FP8 shapes (M×N×K 8192×8192×8192, 4096×7168×16384, 2048×8192×28672, 4096×5120×13824) and the
# grouped seed cases (benches/src/grouped.rs SEED_CASES, contiguous layout), one table of both.
# It runs in two places:
#
#   scripts/deepgemm-compare.sh stage DEEPGEMM_DIR [OUTDIR]      here (no GPU, no network)
#     DEEPGEMM_DIR is a DeepGEMM checkout with its submodules, or a plain copy of one (no .git).
#     Copies into OUTDIR (default stage-deepgemm/ at the repository root; git-ignored) what the
#     build and the kernels compiled at run time read, nothing else: DeepGEMM's setup.py, csrc/,
#     deep_gemm/, scripts/ (setup.py imports its .pyi generator from there) and LICENSE; of CUTLASS
#     only include/cute and include/cutlass (the extension compiles against them, and setup.py's
#     build_py copies both into the package, where the JIT's kernels find them through
#     deep_gemm/include); of fmt only include/ (header-only, read by the build alone). With them
#     benches/peers/deepgemm_bench.py and its harness.py, this script, and VERSIONS: the commits (a plain copy does
#     not know them: DEEPGEMM_COMMIT, CUTLASS_COMMIT and FMT_COMMIT say them) and a hash of the
#     staged files. Then: tar cf - stage-deepgemm | xz -T2 -6 > .stage-pack/deepgemm.tar.xz
#
#   bash stage-deepgemm/deepgemm-compare.sh run RUNNER          on the GPU machine (nvcc, python3
#     with torch, g++, pip; no network needed). RUNNER is a blockscaled-run binary. Builds
#     DeepGEMM's wheel with the system gcc/g++ (the extension must be compiled against the C++
#     library the process loads: a newer compiler's headers against the system libstdc++ crash at
#     the first std::regex), installs it with pip into DG_SITE (default /tmp/dgsite; skipped when
#     the same staged tree is installed there already), compiles the kernels of every case in
#     parallel processes into DeepGEMM's JIT cache, then times DeepGEMM (deepgemm_bench.py) and our
#     runner on the same shapes, and prints one table. Logs, JSON Lines and the table go to $OUT
#     (default /tmp/deepgemm-out); each phase prints its seconds.
#
# Settings for `run` (environment): ITERS (default 50) and WARMUP (10) for both sides; SEED (0);
# PEER=0 drops the runner's cuBLASLt column (and its cross-check against cuBLASLt); JOBS (16) is
# the build's MAX_JOBS; DG_JIT_USE_NVRTC (default 1: NVRTC compiles DeepGEMM's kernels several
# times faster than NVCC; DeepGEMM's README warns it "may have lower performance for some cases",
# so DG_JIT_USE_NVRTC=0 times NVCC's kernels; if NVRTC cannot compile them here, NVCC is used and
# that choice kept in the cache); DG_CACHE, the JIT cache (default /tmp/dg-cache: it outlives the
# command on a machine kept warm; its kernels are copied to $OUT/dg-cache); SKIP_DG=1 or SKIP_OURS=1
# reuse that side's results from the previous run on this machine.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "deepgemm-compare: $*" >&2; exit 1; }

stage() {
  local src=${1:?usage: deepgemm-compare.sh stage DEEPGEMM_DIR [OUTDIR]}
  local root bench out kind dg cut fmt cut_pin fmt_pin version tree ours dirty f
  root=$(cd "$here/.." && pwd)
  bench="$root/benches/peers/deepgemm_bench.py"
  [ -f "$bench" ] || die "stage runs from the repository's scripts/ (no $bench)"
  src=$(cd "$src" && pwd -P)
  out=${2:-$root/stage-deepgemm}
  for f in setup.py csrc deep_gemm/__init__.py deep_gemm/include/deep_gemm scripts/generate_pyi.py; do
    [ -e "$src/$f" ] || die "$src is not a DeepGEMM source tree (no $f)"
  done
  for f in cutlass/include/cute cutlass/include/cutlass fmt/include/fmt; do
    [ -d "$src/third-party/$f" ] || die "no third-party/$f in $src: the submodules are needed (git submodule update --init)"
  done
  if [ -e "$out" ] && [ ! -f "$out/VERSIONS" ] && [ -n "$(ls -A "$out")" ]; then
    die "$out is not empty and not a staged folder: choose another OUTDIR"
  fi
  rm -rf "$out"
  mkdir -p "$out/deepgemm/third-party"
  local files=(setup.py csrc deep_gemm scripts)
  [ -e "$src/LICENSE" ] && files+=(LICENSE)
  if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null | xargs -r realpath)" = "$src" ]; then
    kind="git checkout $src"
    (cd "$src" && git ls-files -z -- "${files[@]}" | tar --null -T - -cf -) | tar -xf - -C "$out/deepgemm"
    dg=$(git -C "$src" rev-parse HEAD)
    [ -z "$(git -C "$src" status --porcelain --untracked-files=no -- "${files[@]}")" ] || dg+=" with uncommitted changes"
    cut_pin=$(git -C "$src" ls-tree HEAD third-party/cutlass | awk '{print $3}')
    fmt_pin=$(git -C "$src" ls-tree HEAD third-party/fmt | awk '{print $3}')
    cut=$(git -C "$src/third-party/cutlass" rev-parse HEAD 2>/dev/null || echo "unknown")
    fmt=$(git -C "$src/third-party/fmt" rev-parse HEAD 2>/dev/null || echo "unknown")
    [ "$cut" = "$cut_pin" ] || cut+=" (DeepGEMM pins $cut_pin)"
    [ "$fmt" = "$fmt_pin" ] || fmt+=" (DeepGEMM pins $fmt_pin)"
  else
    # A plain copy may hold a build's leftovers: the extension, caches, envs.py (it fixes the JIT
    # cache's place) and the headers a development install links into deep_gemm/include.
    kind="plain tree $src"
    (cd "$src" && tar -cf - --exclude=__pycache__ --exclude='*.pyc' --exclude='*.so' \
      --exclude=deep_gemm/envs.py --exclude=deep_gemm/_C.pyi \
      --exclude=deep_gemm/include/cute --exclude=deep_gemm/include/cutlass "${files[@]}") \
      | tar -xf - -C "$out/deepgemm"
    dg=${DEEPGEMM_COMMIT:-unknown (a plain tree; DEEPGEMM_COMMIT says it)}
    cut=${CUTLASS_COMMIT:-unknown (CUTLASS_COMMIT says it)}
    fmt=${FMT_COMMIT:-unknown (FMT_COMMIT says it)}
  fi
  (cd "$src/third-party" && tar -cf - cutlass/include/cute cutlass/include/cutlass fmt/include) \
    | tar -xf - -C "$out/deepgemm/third-party"
  version=$(sed -n "s/^__version__ = ['\"]\([^'\"]*\)['\"].*/\1/p" "$out/deepgemm/deep_gemm/__init__.py")
  tree=$(cd "$out/deepgemm" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  ours=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
  dirty=$(git -C "$root" status --porcelain -- benches/peers/deepgemm_bench.py benches/peers/harness.py scripts/deepgemm-compare.sh 2>/dev/null)
  [ -z "$dirty" ] || ours+=" (deepgemm_bench.py, harness.py or this script not committed)"
  cp "$bench" "$root/benches/peers/harness.py" "$here/deepgemm-compare.sh" "$out/"
  cat > "$out/VERSIONS" <<EOF
deepgemm     $dg (version ${version:-?}; from a $kind)
cutlass      $cut (include/cute, include/cutlass)
fmt          $fmt (include)
staged-tree  $tree (sha256 over the files under deepgemm/)
blockscaled  $ours
staged       $(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
  cat "$out/VERSIONS"
  du -sh "$out"
}

# Ends a phase: its seconds (since the previous phase ended), printed and kept for the summary.
phase() {
  local t s
  t=$(date +%s.%N)
  s=$(awk -v a="$last" -v b="$t" 'BEGIN { printf "%.1f", b - a }')
  last=$t
  phases+=("$1 ${s}s")
  echo "--- $1: $s s"
}

# Builds DeepGEMM's wheel and installs it into $site; skipped when $site holds this staged tree
# built by this compiler against this toolkit already.
build_install() {
  local stamp bdir=/tmp/dg-build shim=/tmp/dg-build-shim whl
  stamp="$(awk '$1 == "staged-tree" { print $2 }' "$here/VERSIONS") $(/usr/bin/g++ -dumpfullversion 2>/dev/null) $CUDA_HOME"
  if [ -f "$site/.stamp" ] && [ "$(cat "$site/.stamp")" = "$stamp" ]; then
    echo "DeepGEMM: reusing the build installed in $site"
  else
    rm -rf "$bdir" "$shim"; cp -a "$here/deepgemm" "$bdir"; mkdir -p "$shim"
    # setup.py imports wheel.bdist_wheel and packaging after setuptools, whose vendored copies
    # serve where they are not installed; where neither serves, these stand in (no network here).
    if ! python3 -c 'import setuptools, wheel.bdist_wheel' 2>/dev/null; then
      mkdir -p "$shim/wheel"; : > "$shim/wheel/__init__.py"
      echo 'from setuptools.command.bdist_wheel import bdist_wheel' > "$shim/wheel/bdist_wheel.py"
    fi
    if ! python3 -c 'import setuptools, packaging.version' 2>/dev/null; then
      mkdir -p "$shim/packaging"; : > "$shim/packaging/__init__.py"
      echo 'from setuptools._vendor.packaging.version import *' > "$shim/packaging/version.py"
    fi
    echo "DeepGEMM: building the wheel (log: $OUT/deepgemm-build.log)"
    # The DG_JIT_* variables setup.py would bake into the package stay out of the build; g++
    # links, so that the extension names the C++ library it was compiled against. Where this
    # setuptools no longer runs `setup.py bdist_wheel`, pip drives the same setup.py.
    build() {
      (cd "$bdir" && env -u DG_JIT_CACHE_DIR -u DG_JIT_PRINT_COMPILER_COMMAND -u DG_JIT_CPP_STANDARD \
        PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}" CC=/usr/bin/gcc CXX=/usr/bin/g++ \
        LDSHARED="/usr/bin/g++ -shared" LDCXXSHARED="/usr/bin/g++ -shared" MAX_JOBS="${JOBS:-16}" \
        DG_USE_LOCAL_VERSION=1 "$@") >> "$OUT/deepgemm-build.log" 2>&1
    }
    : > "$OUT/deepgemm-build.log"
    if ! build python3 setup.py bdist_wheel; then
      if grep -qE "invalid command 'bdist_wheel'|No module named 'wheel" "$OUT/deepgemm-build.log" \
          && build python3 -m pip wheel --no-build-isolation --no-deps --no-index -w dist .; then
        :
      else
        tail -30 "$OUT/deepgemm-build.log"
        die "the DeepGEMM build failed (log: $OUT/deepgemm-build.log)"
      fi
    fi
    whl=$(find "$bdir/dist" -name '*.whl' 2>/dev/null | head -1)
    [ -n "$whl" ] || die "the DeepGEMM build left no wheel (log: $OUT/deepgemm-build.log)"
    phase "build ($(basename "$whl"))"
    rm -rf "$site"
    if ! python3 -m pip install --no-deps --no-index --target "$site" "$whl" > "$OUT/deepgemm-install.log" 2>&1; then
      tail -20 "$OUT/deepgemm-install.log"
      die "pip install failed (log: $OUT/deepgemm-install.log)"
    fi
    # The kernels compiled at run time include these from the package (setup.py's build_py).
    [ -d "$site/deep_gemm/include/cute" ] && [ -d "$site/deep_gemm/include/cutlass" ] \
      || die "the installed package has no include/cute or include/cutlass"
    echo "$stamp" > "$site/.stamp"
    phase install
  fi
  python3 "$bench" --import-check | tee -a "$OUT/environment.txt" | grep " from $site/deep_gemm\$" \
    || die "deep_gemm does not import from $site"
  phase "import check"
}

# Every case's first call, each case in a process of its own, all at once: each compiles its
# case's kernels into DeepGEMM's cache, which takes concurrent writers.
jit_all() {
  local n pids=() rc=0
  for n in $(python3 "$bench" --list); do
    # A working directory each: NVRTC writes its precompiled header where it runs.
    mkdir -p "$work/jit-$n"
    (cd "$work/jit-$n" && exec python3 "$bench" --cases "$n" --jit-only) > "$OUT/jit-$n.log" 2>&1 &
    pids+=("$!")
  done
  for n in "${pids[@]}"; do wait "$n" || rc=1; done
  grep -hE "first call|ERROR" "$OUT"/jit-*.log || true
  return $rc
}

# The JIT's compiler (NVRTC unless told otherwise, or unless it failed here before) and the
# kernels compiled before any timing.
jit() {
  local cccl="$CUDA_HOME/include/cccl" inc="$site/deep_gemm/include" d f
  if [ -z "${DG_JIT_USE_NVRTC:-}" ]; then
    DG_JIT_USE_NVRTC=1
    if [ "$(cat "$DG_JIT_CACHE_DIR/.compiler" 2>/dev/null)" = nvcc ]; then DG_JIT_USE_NVRTC=0; fi
  fi
  export DG_JIT_USE_NVRTC
  # NVRTC has no include path of its own and DeepGEMM gives it deep_gemm/include and
  # $CUDA_HOME/include only; from CUDA 13 libcu++ (<cuda/std/...>, which CUTLASS and DeepGEMM's
  # kernels include) lives in $CUDA_HOME/include/cccl, a path NVCC adds by itself. Linked into the
  # package's include directory, NVRTC finds it (NVCC reads the same files through the links).
  if [ "$DG_JIT_USE_NVRTC" = 1 ] && [ -d "$cccl/cuda/std" ] && [ ! -e "$CUDA_HOME/include/cuda/std" ]; then
    for d in cuda nv cub thrust; do
      if [ -d "$cccl/$d" ] && [ ! -e "$CUDA_HOME/include/$d" ] && [ ! -e "$inc/$d" ]; then
        ln -s "$cccl/$d" "$inc/$d"
      fi
    done
  fi
  echo "DeepGEMM: compiling the kernels with $([ "$DG_JIT_USE_NVRTC" = 1 ] && echo NVRTC || echo NVCC) into $DG_JIT_CACHE_DIR"
  if ! jit_all; then
    [ "$DG_JIT_USE_NVRTC" = 1 ] || die "the JIT failed (logs: $OUT/jit-*.log)"
    echo "DeepGEMM: NVRTC failed (logs kept as $OUT/nvrtc-jit-*.log); compiling with NVCC"
    for f in "$OUT"/jit-*.log; do mv "$f" "$OUT/nvrtc-$(basename "$f")"; done
    DG_JIT_USE_NVRTC=0
    echo nvcc > "$DG_JIT_CACHE_DIR/.compiler"
    jit_all || die "the JIT failed with NVCC too (logs: $OUT/jit-*.log)"
  fi
  phase "jit ($([ "$DG_JIT_USE_NVRTC" = 1 ] && echo nvrtc || echo nvcc))"
}

# DeepGEMM timed (deepgemm_bench.py, every case in one process, the kernels from the cache).
time_deepgemm() {
  rm -f "$OUT/deepgemm.jsonl"
  echo "=== DeepGEMM"
  if ! (cd "$work" && python3 "$bench" --iters "$iters" --warmup "$warmup" --seed "$seed" \
      --json "$OUT/deepgemm.jsonl") 2>&1 | tee "$OUT/deepgemm.log"; then
    status=1
    echo "DeepGEMM: a case failed (log: $OUT/deepgemm.log)"
  fi
  cp "$OUT/deepgemm.jsonl" "$last_dir/" 2>/dev/null || true
  phase deepgemm
}

# Our runner on the same shapes: each dense shape (deepseek-fp8: 1 × 128 activation scales,
# 128 × 128 weight scales, bf16 output), then the grouped seed cases (contiguous layout).
time_ours() {
  local lt rl s args=(--recipe deepseek-fp8 --iterations "$iters" --warmup_iterations "$warmup"
    --seed "$seed" --skip_ref_check --json "$OUT/ours.jsonl")
  [ "${PEER:-1}" != 0 ] || args+=(--no_peer)
  rm -f "$OUT/ours.jsonl"
  : > "$OUT/ours.log"
  # The runner loads cuBLASLt (its peer, and the ceilings it measures first) by name.
  lt=$(find / -name 'libcublasLt.so.1[0-9]*' -not -path '/proc/*' 2>/dev/null | head -1 || true)
  rl="${lt:+$(dirname "$lt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  for s in $(python3 "$bench" --list-dense) group; do
    local shape=(--mnkl "$s")
    [ "$s" != group ] || shape=(--group_case 0)
    echo "=== ours ${shape[*]}" | tee -a "$OUT/ours.log"
    if ! LD_LIBRARY_PATH="$rl" "$runner" "${shape[@]}" "${args[@]}" 2>&1 | tee -a "$OUT/ours.log"; then
      status=1
      echo "ours: ${shape[*]} failed"
    fi
  done
  cp "$OUT/ours.jsonl" "$last_dir/" 2>/dev/null || true
  phase ours
}

# One table: ours, DeepGEMM and the runner's cuBLASLt per case (also as $OUT/compare.jsonl).
table() {
  python3 - "$OUT/ours.jsonl" "$OUT/deepgemm.jsonl" "$OUT/compare.jsonl" <<'PY'
import json, math, sys

def load(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except FileNotFoundError:
        return []

ours, dg = load(sys.argv[1]), load(sys.argv[2])

# Ours: dense rows by M, N, K (L = 1); grouped rows by Σ rows, N, K, G (the runner's M and L).
# DeepGEMM's the same way; the last row of a key wins.
def ours_key(r):
    if r.get("kind") == "grouped":
        return ("grouped", r["m"], r["n"], r["k"], r["l"])
    return ("dense", r["m"], r["n"], r["k"]) if r.get("l", 1) == 1 else None

def dg_key(r):
    if r["kind"] == "grouped":
        return ("grouped", r["rows"], r["n"], r["k"], len(r["groups"]))
    return ("dense", r["m"], r["n"], r["k"])

om = {ours_key(r): r for r in ours if ours_key(r)}
f = lambda x, fmt: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt % x
first = (dg or [{}])[0]
print("DeepGEMM %s (JIT %s) beside blockscaled on %s; medians, µs; X/ours: X's time over ours "
      "(above 1: ours is faster)" % (first.get("deep_gemm", "?"), first.get("jit", "?"),
                                     first.get("gpu", (ours or [{}])[0].get("gpu", "?"))))
hdr = ("case", "shape", "ours µs", "TFLOP/s", "DG µs", "TFLOP/s", "DG/ours", "DG 1-set µs",
       "1-set/ours", "cuBLASLt µs", "cuBLASLt/ours", "DG rel err")
line = "%-21s %-36s %9s %8s %9s %8s %8s %11s %10s %11s %13s %10s"
print(line % hdr)
merged, ratios, seen = [], {"dense": [], "grouped": []}, set()
for r in dg:
    k = dg_key(r); seen.add(k); o = om.get(k)
    if r["kind"] == "dense":
        shape = "%dx%dx%d" % (r["m"], r["n"], r["k"])
    else:
        shape = "G=%d %d rows (DG %d) N=%d K=%d" % (len(r["groups"]), r["rows"], r["padded_rows"], r["n"], r["k"])
    ou = o["us"] if o else None
    ratio = r["us"] / ou if ou else None
    one = r.get("us_one_set")
    peer = o.get("peer_us") if o else None
    if ratio:
        ratios[r["kind"]].append(ratio)
    print(line % (r["name"], shape, f(ou, "%.1f"), f(o.get("tflops") if o else None, "%.0f"),
                  f(r["us"], "%.1f"), f(r["tflops"], "%.0f"), f(ratio, "%.2f"), f(one, "%.1f"),
                  f(one / ou if one and ou else None, "%.2f"), f(peer, "%.1f"),
                  f(peer / ou if peer and ou else None, "%.2f"),
                  "%.1e" % r["rel_err"] if "rel_err" in r else "-") + ("" if r.get("ok", True) else " FAILED"))
    merged.append({"case": r["name"], "shape": shape, "ours_us": ou, "deepgemm_us": r["us"],
                   "deepgemm_over_ours": ratio, "deepgemm_one_set_us": one,
                   "cublaslt_us": peer, "deepgemm_rel_err": r.get("rel_err"),
                   "ours_plan": o.get("plan") if o else None, "deepgemm_gate": r.get("gate")})
for k, o in om.items():
    if k not in seen:
        print(line % ("(ours only)", "%s %s" % (k[0], "x".join(map(str, k[1:]))), f(o["us"], "%.1f"),
                      f(o.get("tflops"), "%.0f"), "-", "-", "-", "-", "-", f(o.get("peer_us"), "%.1f"), "-", "-"))
for kind, rs in ratios.items():
    if rs:
        print("DG/ours, geometric mean over the %s cases: %.3f" % (kind, math.exp(sum(map(math.log, rs)) / len(rs))))
print("Grouped: DeepGEMM's contiguous layout pads each group to a multiple of its M alignment "
      "(rows 'DG'); TFLOP/s count the groups' own rows on both sides. DG µs rotates operand sets "
      "past L2; DG 1-set µs reuses one set as our grouped timing does.")
bad = [r["name"] for r in dg if r.get("gate") not in (None, "held")]
if bad:
    print("Gate not held (host launch time may be in DeepGEMM's timing): " + ", ".join(bad))
with open(sys.argv[3], "w") as out:
    for m in merged:
        out.write(json.dumps(m) + "\n")
failed = [r["name"] for r in dg if not r.get("ok", True)]
if failed:
    print("DeepGEMM's result failed its check: " + ", ".join(failed))
if not dg or not ours:
    print("missing results: %s" % ", ".join(n for n, rs in (("DeepGEMM", dg), ("ours", ours)) if not rs))
sys.exit(1 if failed or not dg or not ours else 0)
PY
}

run() {
  runner=${1:?usage: deepgemm-compare.sh run RUNNER}
  [ -x "$runner" ] || die "no executable runner at $runner"
  runner=$(realpath "$runner")
  [ -d "$here/deepgemm" ] && [ -f "$here/VERSIONS" ] || die "run from a staged folder (see stage)"
  [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ] || die "no system gcc/g++ in /usr/bin"
  OUT=${OUT:-/tmp/deepgemm-out}
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
  bench="$here/deepgemm_bench.py" site=$(realpath -m "${DG_SITE:-/tmp/dgsite}") work=/tmp/dg-run
  last_dir=/tmp/deepgemm-compare-last
  iters=${ITERS:-50} warmup=${WARMUP:-10} seed=${SEED:-0} status=0
  last=$(date +%s.%N) start=$(date +%s.%N) phases=()
  mkdir -p "$work" "$last_dir"
  cp "$here/VERSIONS" "$OUT/VERSIONS"

  # The toolkit DeepGEMM compiles against: CUDA_HOME, else /usr/local/cuda, else nvcc's.
  if [ -z "${CUDA_HOME:-}" ]; then
    local nvcc=/usr/local/cuda/bin/nvcc
    [ -x "$nvcc" ] || nvcc=$(command -v nvcc || true)
    [ -n "$nvcc" ] || die "no nvcc (set CUDA_HOME)"
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  fi
  export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  export DG_JIT_CACHE_DIR=${DG_CACHE:-/tmp/dg-cache} DG_PRINT_CONFIGS=1
  mkdir -p "$DG_JIT_CACHE_DIR"
  {
    cat "$here/VERSIONS"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true
    "$CUDA_HOME/bin/nvcc" --version | grep -i release || true
    /usr/bin/g++ --version | head -1
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda)' || true
  } 2>&1 | tee "$OUT/environment.txt"
  phase environment

  if [ "${SKIP_DG:-0}" = 1 ]; then
    [ -f "$OUT/deepgemm.jsonl" ] || cp "$last_dir/deepgemm.jsonl" "$OUT/" 2>/dev/null \
      || echo "SKIP_DG: no earlier DeepGEMM results on this machine"
  else
    build_install
    jit
    time_deepgemm
  fi
  if [ "${SKIP_OURS:-0}" = 1 ]; then
    [ -f "$OUT/ours.jsonl" ] || cp "$last_dir/ours.jsonl" "$OUT/" 2>/dev/null \
      || echo "SKIP_OURS: no earlier results of ours on this machine"
  else
    time_ours
  fi
  if [ -d "$DG_JIT_CACHE_DIR/cache" ] && [ "$DG_JIT_CACHE_DIR" != "$OUT/dg-cache" ]; then
    mkdir -p "$OUT/dg-cache" && cp -r "$DG_JIT_CACHE_DIR/cache/." "$OUT/dg-cache/"
  fi
  echo
  table | tee "$OUT/compare.txt" || status=1
  phase table
  echo "phases: $(printf '%s; ' "${phases[@]}")total $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
  echo "output: $OUT"
  return $status
}

case "${1:-}" in
  stage) shift; stage "$@" ;;
  run) shift; run "$@" ;;
  *) die "usage: deepgemm-compare.sh stage DEEPGEMM_DIR [OUTDIR] | deepgemm-compare.sh run RUNNER" ;;
esac
