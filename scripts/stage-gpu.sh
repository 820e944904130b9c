#!/usr/bin/env bash
# Builds release test, bench and runner binaries (each embeds the kernels' cubins and PTX) and
# stages them, with run-gpu.sh, in stage/ (git-ignored; since every binary holds the images, pack
# what the GPU machine needs with xz: a few MiB) for a GPU machine that has no Rust: copy it
# anywhere with an NVIDIA driver and run `bash stage/run-gpu.sh [runner args]` there.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)"
export BLOCKSCALED_REQUIRE_PTXAS=1
rm -rf stage && mkdir -p stage/tests
json=$(cargo test --release --workspace --exclude blockscaled-candle --no-run --message-format=json 2>/dev/null)
cargo build --release -p blockscaled-benches --bins --benches 2>&1 | grep -E "^(warning|error)" || true
echo "$json" | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        t = m["target"]; kind = t["kind"][0]
        name = t["name"] if kind == "test" else m["package_id"].split("#")[0].rsplit("/", 1)[-1] + "-" + kind
        shutil.copy(m["executable"], os.path.join("stage/tests", name))
'
cp target/release/blockscaled-run target/release/blockscaled-perf-table stage/
# blockscaled-candle on its own (candle's CUDA build; its cudarc links the CUDA libraries, which
# the GPU machine has): its GPU tests as stage/tests/candle-gpu_candle, its timing example as
# stage/examples/candle-timing.
(
  eval "$(scripts/setup.sh --candle)"
  cjson=$(cargo test --release -p blockscaled-candle --no-run --message-format=json 2>/dev/null)
  echo "$cjson" | python3 -c '
import json, sys, shutil
for line in sys.stdin:
    try: m = json.loads(line)
    except Exception: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], "stage/tests/candle-" + m["target"]["name"])
'
  cargo build --release -p blockscaled-candle --examples 2>&1 | grep -E "^error" || true
  mkdir -p stage/examples && cp target/release/examples/timing stage/examples/candle-timing
)
# The examples, as this workspace builds them and as a stable-Rust user's project does (from the
# shipped kernel images): stage/examples/{quickstart,gemm_check,expert_parallel} and stage/user/{…}.
cargo build --release -p blockscaled --features nccl --examples 2>&1 | grep -E "^error" || true
mkdir -p stage/examples && cp target/release/examples/quickstart target/release/examples/gemm_check target/release/examples/expert_parallel stage/examples/
BLOCKSCALED_USER_BUILD_OUT="$PWD/stage/user" scripts/check-user-build.sh >/dev/null
bench=$(ls -t target/release/deps/gemm-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
[ -n "$bench" ] && cp "$bench" stage/bench-gemm
cp scripts/run-gpu.sh scripts/sanitize-gpu.sh scripts/profile-gpu.sh scripts/ncu-compare.sh scripts/ncu-source.sh scripts/tile-sweep.sh scripts/grouped-sweep.sh scripts/decode-sweep.sh scripts/ab-gpu.sh scripts/ab-runner.sh scripts/perf-md.sh stage/
strip stage/tests/* stage/blockscaled-run stage/blockscaled-perf-table stage/bench-gemm stage/examples/* stage/user/* 2>/dev/null || true
cp target/release/ptx/*.ptx target/release/ptx/*.cubin target/release/ptx/*.ptxas.txt stage/ 2>/dev/null || true
du -sh stage
ls stage stage/tests
