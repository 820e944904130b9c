#!/usr/bin/env bash
# The K loop of a kernel, instruction by instruction, without a GPU: its SASS (nvdisasm) cut
# into the blocks that issue `wgmma` (QGMMA/HGMMA), each block counted by kind (FFMA, GMMA,
# shuffles, moves to uniform registers, convergence, loads, barriers, uniform arithmetic, the
# rest). With `--deepgemm DIR` (a DeepGEMM checkout with third-party/cutlass, as
# deepgemm-compare.sh stages it), DeepGEMM's sm90_fp8_gemm_1d2d kernel for the same dense
# configuration is compiled here with the pinned nvcc (`setup.sh --candle`) and counted the same
# way, so the two consumer loops can be compared while the loop is changed.
#   scripts/kloop-sass.sh [KERNEL] [CUBIN]        (default: sm90_fp8_blockscaled_gemm_m256 of
#                                                   host/kernel-images/sm_90a.cubin)
#   scripts/kloop-sass.sh --deepgemm DIR           (256 x 128 tiles, pairs, 3 stages, as it
#                                                   runs 8192^3 on the H200)
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/setup.sh)" >/dev/null
nvdisasm=${NVDISASM:?setup.sh gives nvdisasm}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
if [ "${1:-}" = --deepgemm ]; then
  dg=${2:?usage: kloop-sass.sh --deepgemm DIR}
  eval "$(scripts/setup.sh --candle)" >/dev/null
  cat > "$work/k.cu" <<'CU'
#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>
using namespace deep_gemm;
static void instantiate() {
    auto ptr = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<
        cute::UMMA::Major::K, 0, 8192, 8192, 1, 256, 128, 128, 128, 128, 128, 3, 128, 256, 2, true,
        132, GemmType::Normal, cutlass::bfloat16_t, epilogue::transform::EpilogueIdentity>);
    (void)ptr;
}
CU
  nvcc -std=c++20 -O3 --expt-relaxed-constexpr --expt-extended-lambda -w \
    -gencode arch=compute_90a,code=sm_90a -cubin -I"$dg/deep_gemm/include" \
    -I"$dg/third-party/cutlass/include" -I"$CUDA_ROOT/include" "$work/k.cu" -o "$work/k.cubin"
  "$nvdisasm" -c "$work/k.cubin" > "$work/k.sass"
  what="DeepGEMM sm90_fp8_gemm_1d2d (256 x 128, pairs, 3 stages)"
else
  kernel=${1:-sm90_fp8_blockscaled_gemm_m256}; cubin=${2:-host/kernel-images/sm_90a.cubin}
  index=$(python3 - "$cubin" "$kernel" <<'PY'
import struct, sys
elf = open(sys.argv[1], 'rb').read()
shoff = struct.unpack_from('<Q', elf, 0x28)[0]; shentsize, shnum = struct.unpack_from('<HH', elf, 0x3a)
secs = [struct.unpack_from('<IIQQQQIIQQ', elf, shoff + i * shentsize) for i in range(shnum)]
for s in secs:
    if s[1] == 2:
        off, size, strtab = s[4], s[5], secs[s[6]][4]
        for i in range(size // 24):
            name = struct.unpack_from('<I', elf, off + i * 24)[0]
            if elf[strtab + name:elf.index(b'\0', strtab + name)].decode() == sys.argv[2]:
                print(i); sys.exit(0)
sys.exit("no function symbol " + sys.argv[2])
PY
)
  "$nvdisasm" -c -fun "$index" "$cubin" > "$work/k.sass"
  what="$kernel ($cubin)"
fi
python3 - "$work/k.sass" "$what" <<'PY'
import re, sys
lines = [l for l in open(sys.argv[1]) if re.search(r'/\*[0-9a-f]{4,}\*/', l)]
kinds = [('FFMA', r'\bFFMA\b'), ('GMMA', r'\b[QH]GMMA\b'), ('SHFL', r'\bSHFL\b'),
         ('R2UR', r'\bR2UR\b'), ('convergence', r'\b(BSSY|BSYNC|WARPSYNC|BRA\.DIV)\b'),
         ('loads', r'\b(LDS|LDG|LDL|LDC|ULDC)\b'), ('barriers', r'\b(SYNCS|BAR|WARPGROUP)\b'),
         ('uniform', r'\bU[A-Z0-9]+\b(?!.*\bR[0-9])'), ('other', r'.')]
blocks, cur = [], []
for l in lines:
    cur.append(l)
    if re.search(r'\bBRA\b', l):
        if any(re.search(r'[QH]GMMA', x) for x in cur):
            blocks.append(cur)
        cur = []
print(sys.argv[2])
print(f"{'block':>5} {'instr':>6} " + ' '.join(f'{k:>11}' for k, _ in kinds))
for i, b in enumerate(blocks):
    counts = {k: 0 for k, _ in kinds}
    for l in b:
        op = l.split(';')[0]
        for k, rx in kinds:
            if re.search(rx, op):
                counts[k] += 1; break
    print(f"{i:>5} {len(b):>6} " + ' '.join(f'{counts[k]:>11}' for k, _ in kinds))
PY
