#!/usr/bin/env bash
# Makes link-time stand-ins for the CUDA libraries candle links (libcuda, libnvrtc, libcurand,
# libcublas, libcublasLt) in DIR, so that blockscaled-candle's tests and examples link on a
# machine without CUDA (CI, this repository's build machines). Each stand-in has the real
# library's soname and the names of the functions cudarc declares, and nothing else: a program
# linked against them runs against the real libraries of a GPU machine (LD_LIBRARY_PATH), and
# never against these (they are not on any run-time path). Needs a C compiler and python3.
# candle's kernels also link the CUDA runtime (their MoE helpers): with CUDA_ROOT set to a CUDA
# tree holding lib/libcudart.so.13 (the pip package's), DIR gets a `libcudart.so` link to it.
# Usage: scripts/cuda-link-stubs.sh DIR   (prints the line to export LIBRARY_PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: cuda-link-stubs.sh DIR}
mkdir -p "$dir"
cargo fetch --quiet
cudarc=$(cargo metadata --format-version 1 --quiet \
  | python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"]=="cudarc").rsplit("/",1)[0])')
cc=${CC:-$(command -v cc || command -v gcc)}
# library name : soname : cudarc's bindings
for spec in cuda:libcuda.so.1:driver nvrtc:libnvrtc.so.13:nvrtc curand:libcurand.so.10:curand \
            cublas:libcublas.so.13:cublas cublasLt:libcublasLt.so.13:cublaslt; do
  IFS=: read -r name soname module <<<"$spec"
  python3 - "$cudarc/src/$module/sys/mod.rs" >"$dir/$name.c" <<'PY'
import re, sys
names = sorted(set(re.findall(r'pub unsafe fn (\w+)\(', open(sys.argv[1]).read())))
for n in names:
    if not n.startswith('is_'):
        print(f'void {n}(void) {{}}')
PY
  "$cc" -shared -fPIC -o "$dir/$soname" -Wl,-soname,"$soname" "$dir/$name.c"
  ln -sf "$soname" "$dir/lib$name.so"
done
if [ -n "${CUDA_ROOT:-}" ] && [ -f "$CUDA_ROOT/lib/libcudart.so.13" ]; then
  ln -sf "$CUDA_ROOT/lib/libcudart.so.13" "$dir/libcudart.so"
fi
echo "export LIBRARY_PATH=$dir\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
