"""blockscaled's Python package beside torch and DeepGEMM, in one process, timed one way
(harness.py: CUDA events, warm-up, medians, operand sets rotated past L2, launches behind a closed
stream), on DeepSeek FP8 operands (e4m3, fp32 scales per 1 × 128 of the activations and per
128 × 128 of the weights, bf16 output):

- dense `fp8_gemm_nt` at decode and prefill sizes;
- grouped, contiguous (torch's `offs`; DeepGEMM pads each group to its alignment and marks the
  padding -1 in `m_indices`) and masked (decode: G × capacity rows, the counts on the GPU).

Peers: torch's block-wise `_scaled_mm` where this torch has it, else torch's bf16 product of the
dequantized operands (`_grouped_mm` for groups where it exists, else a loop of matmuls; `bmm` for
masked groups, every capacity row); DeepGEMM where `deep_gemm` imports. Every side's result is
checked against an fp32 product of the dequantized operands (relative Frobenius error ≤ 1e-2 on
the rows it owns). The host time per call after the warm-up is printed beside ours; `--host-cost`
times the call alone as `blockscaled-run --engine` times the Rust one (issue 50's target: the
package ≤ 5 µs over the Rust call, at 16 × 7168 × 2048).

    python3 benches/peers/compare.py [--cases all|NAME,...] [--iters 50] [--warmup 10] [--json F]
    python3 benches/peers/compare.py --host-cost
"""
import argparse
import json
import sys

from harness import Timer

MAX_REL_ERR = 1e-2
E4M3_MAX = 448.0

# name, kind, spec: dense (M, N, K); contiguous / masked (rows per group, N, K[, capacity]).
CASES = [
    ("decode-16x7168x2048", "dense", (16, 7168, 2048)),
    ("decode-128x7168x2048", "dense", (128, 7168, 2048)),
    ("prefill-4096x7168x2048", "dense", (4096, 7168, 2048)),
    ("prefill-4096x24576x1536", "dense", (4096, 24576, 1536)),
    ("large-8192x8192x8192", "dense", (8192, 8192, 8192)),
    ("grouped-seed1", "contiguous", ([80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168)),
    ("grouped-mixtral-4096", "contiguous", ([759, 249, 651, 385, 898, 320, 510, 324], 14336, 4096)),
    ("masked-8x256", "masked", ([41, 7, 63, 0, 22, 58, 12, 35], 4096, 7168, 256)),
]


class Sides(Timer):
    def __init__(self, args):
        Timer.__init__(self, args.warmup, args.iters)
        import blockscaled

        self.bs = blockscaled
        try:
            from deepgemm_bench import import_deep_gemm

            self.dg = import_deep_gemm()
            from deep_gemm import utils as dgu

            self.dgu = dgu
        except Exception as x:  # DeepGEMM is optional
            self.dg, self.dg_missing = None, str(x)

    # Operands (DeepSeek FP8 as DeepGEMM's tests make them).

    def quantize_rows(self, x):
        t = self.torch
        *lead, k = x.shape
        blocks = x.float().reshape(*lead, k // 128, 128)
        scale = blocks.abs().amax(dim=-1).clamp(min=1e-12) / E4M3_MAX
        codes = (blocks / scale[..., None]).to(t.float8_e4m3fn).reshape(x.shape)
        return codes, scale

    def quantize_blocks(self, w):
        t = self.torch
        n, k = w.shape
        blocks = w.float().reshape(n // 128, 128, k // 128, 128)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
        codes = (blocks / scale[:, None, :, None]).to(t.float8_e4m3fn).reshape(n, k)
        return codes, scale

    @staticmethod
    def deq_rows(codes, scale):
        return codes.float() * scale.repeat_interleave(128, dim=-1)

    @staticmethod
    def deq_blocks(codes, scale):
        return codes.float() * scale.repeat_interleave(128, dim=-2).repeat_interleave(128, dim=-1)

    def rel_err(self, got, ref):
        t = self.torch
        den = t.linalg.vector_norm(ref)
        return float(t.linalg.vector_norm(got.float() - ref) / den) if float(den) > 0 else float("nan")

    def nbytes(self, *ts):
        return sum(x.numel() * x.element_size() for x in ts)

    # Cases: each returns {side: (launch(i), sets, check())} for the sides that can run it.

    def dense(self, m, n, k):
        t = self.torch
        a, sa = self.quantize_rows(t.randn(m, k, device="cuda"))
        b, sb = self.quantize_blocks(t.randn(n, k, device="cuda"))
        fa, fb = self.deq_rows(a, sa), self.deq_blocks(b, sb)
        ref = fa @ fb.t()
        sets = self.rotation(self.nbytes(a, sa, b, sb) + 2 * m * n)
        ops = [(a.clone(), sa.t().contiguous().t(), b.clone(), sb.clone(), t.empty(m, n, device="cuda", dtype=t.bfloat16)) for _ in range(sets)]
        sides = {}

        def ours(i):
            x, sx, y, sy, out = ops[i]
            self.bs.fp8_gemm_nt(x, sx, y, sy, out)

        sides["ours"] = (ours, lambda: self.rel_err(ops[0][4], ref))
        sides["torch"] = self.torch_dense(ops, fa, fb, ref, m, n)
        if self.dg is not None:
            dops = [(x, self.dgu.get_mn_major_tma_aligned_tensor(sx.contiguous()), y, sy, out) for x, sx, y, sy, out in ops]

            def dg(i):
                x, sx, y, sy, out = dops[i]
                self.dg.fp8_gemm_nt((x, sx), (y, sy), out, disable_ue8m0_cast=True)

            sides["DeepGEMM"] = (dg, lambda: self.rel_err(dops[0][4], ref))
        return sides, sets, 2.0 * m * n * k

    def torch_dense(self, ops, fa, fb, ref, m, n):
        t = self.torch
        outs = [t.empty(m, n, device="cuda", dtype=t.bfloat16) for _ in ops]

        def blockwise(i):
            x, sx, y, sy, _ = ops[i]
            outs[i].copy_(t._scaled_mm(x, y.t(), scale_a=sx, scale_b=sy.t(), out_dtype=t.bfloat16))

        try:
            blockwise(0)
            t.cuda.synchronize()
            if self.rel_err(outs[0], ref) <= MAX_REL_ERR:
                return (blockwise, lambda: self.rel_err(outs[0], ref), "_scaled_mm block-wise")
        except Exception:
            pass
        wa, wb = fa.to(t.bfloat16), fb.to(t.bfloat16)

        def bf16(i):
            t.matmul(wa, wb.t(), out=outs[i])

        return (bf16, lambda: self.rel_err(outs[0], ref), "bf16 matmul of the dequantized operands")

    def contiguous(self, rows, n, k):
        t = self.torch
        g, r = len(rows), sum(rows)
        a, sa = self.quantize_rows(t.randn(r, k, device="cuda"))
        coded = [self.quantize_blocks(t.randn(n, k, device="cuda")) for _ in range(g)]
        b, sb = t.stack([c for c, _ in coded]), t.stack([s for _, s in coded])
        fa, fb = self.deq_rows(a, sa), [self.deq_blocks(c, s) for c, s in coded]
        ends = t.tensor(rows, device="cuda").cumsum(0)
        offs = ends.to(t.int32)
        starts = [0] + ends.tolist()[:-1]
        ref = t.cat([fa[s:e] @ fb[i].t() for i, (s, e) in enumerate(zip(starts, ends.tolist()))])
        out = t.empty(r, n, device="cuda", dtype=t.bfloat16)
        sides = {}

        def ours(i):
            self.bs.m_grouped_fp8_gemm_nt_contiguous(a, sa, b, sb, out, offs)

        sides["ours"] = (ours, lambda: self.rel_err(out, ref))
        wa, wb = fa.to(t.bfloat16), t.stack(fb).to(t.bfloat16)
        tout = t.empty(r, n, device="cuda", dtype=t.bfloat16)
        if hasattr(t, "_grouped_mm"):
            def grouped(i):
                tout.copy_(t._grouped_mm(wa, wb.transpose(-2, -1), offs=offs))

            sides["torch"] = (grouped, lambda: self.rel_err(tout, ref), "bf16 _grouped_mm of the dequantized operands")
        else:
            def loop(i):
                for j, (s, e) in enumerate(zip(starts, ends.tolist())):
                    t.matmul(wa[s:e], wb[j].t(), out=tout[s:e])

            sides["torch"] = (loop, lambda: self.rel_err(tout, ref), "a loop of bf16 matmuls")
        if self.dg is not None:
            align = self.dgu.get_mk_alignment_for_contiguous_layout()
            padded = [-(-m // align) * align for m in rows]
            pr = sum(padded)
            da = t.zeros(pr, k, device="cuda", dtype=t.float8_e4m3fn)
            dsa = t.ones(pr, k // 128, device="cuda")
            index = t.full((pr,), -1, device="cuda", dtype=t.int32)
            place, o = [], 0
            for j, (m, p) in enumerate(zip(rows, padded)):
                da[o:o + m], dsa[o:o + m], index[o:o + m] = a[starts[j]:starts[j] + m], sa[starts[j]:starts[j] + m], j
                place.append(o)
                o += p
            dsa = self.dgu.get_mn_major_tma_aligned_tensor(dsa)
            dout = t.empty(pr, n, device="cuda", dtype=t.bfloat16)

            def dg(i):
                self.dg.m_grouped_fp8_gemm_nt_contiguous((da, dsa), (b, sb), dout, index, disable_ue8m0_cast=True)

            def dg_check():
                got = t.cat([dout[p:p + m] for p, m in zip(place, rows)])
                return self.rel_err(got, ref)

            sides["DeepGEMM"] = (dg, dg_check)
        # Grouped cases are timed on one operand set, as blockscaled's runner times them (the
        # experts are the bulk of the bytes).
        return sides, 1, 2.0 * r * n * k

    def masked(self, counts, n, k, cap):
        t = self.torch
        g = len(counts)
        a, sa = self.quantize_rows(t.randn(g, cap, k, device="cuda"))
        coded = [self.quantize_blocks(t.randn(n, k, device="cuda")) for _ in range(g)]
        b, sb = t.stack([c for c, _ in coded]), t.stack([s for _, s in coded])
        fa, fb = self.deq_rows(a, sa), t.stack([self.deq_blocks(c, s) for c, s in coded])
        ref = t.bmm(fa, fb.transpose(1, 2))
        masked_m = t.tensor(counts, device="cuda", dtype=t.int32)
        out = t.empty(g, cap, n, device="cuda", dtype=t.bfloat16)

        def owned(x):
            return t.cat([x[i, :m].float() for i, m in enumerate(counts)])

        sides = {}

        def ours(i):
            self.bs.m_grouped_fp8_gemm_nt_masked(a, sa, b, sb, out, masked_m, expected_m=max(counts))

        sides["ours"] = (ours, lambda: self.rel_err(owned(out), owned(ref)))
        wa, wb = fa.to(t.bfloat16), fb.to(t.bfloat16)
        tout = t.empty(g, cap, n, device="cuda", dtype=t.bfloat16)

        def bmm(i):
            t.bmm(wa, wb.transpose(1, 2), out=tout)

        sides["torch"] = (bmm, lambda: self.rel_err(owned(tout), owned(ref)), "bf16 bmm of the dequantized operands (every capacity row)")
        if self.dg is not None:
            dsa = self.dgu.get_mn_major_tma_aligned_tensor(sa.contiguous())
            dout = t.empty(g, cap, n, device="cuda", dtype=t.bfloat16)

            def dg(i):
                self.dg.m_grouped_fp8_gemm_nt_masked((a, dsa), (b, sb), dout, masked_m, max(counts), disable_ue8m0_cast=True)

            sides["DeepGEMM"] = (dg, lambda: self.rel_err(owned(dout), owned(ref)))
        return sides, 1, 2.0 * sum(counts) * n * k

    def run(self, name, kind, spec):
        self.torch.manual_seed(1)
        sides, sets, flops = getattr(self, kind)(*spec)
        rec = {"name": name, "kind": kind, "spec": [list(x) if isinstance(x, list) else x for x in spec], "flops": flops, "sets": sets}
        for side, entry in sides.items():
            launch, check = entry[0], entry[1]
            try:
                launch(0)
                self.torch.cuda.synchronize()
                err = check()
                r = self.time_launches(launch, sets)
                r.update(rel_err=err, ok=err == err and err <= MAX_REL_ERR)
                if len(entry) > 2:
                    r["path"] = entry[2]
            except Exception as x:
                r = {"error": "%s: %s" % (type(x).__name__, x)}
            rec[side] = r
        return rec


def row(rec):
    ours = rec["ours"].get("us")
    cells = [rec["name"]]
    for side in ("ours", "torch", "DeepGEMM"):
        r = rec.get(side)
        if r is None:
            cells += ["-", "-"]
        elif "error" in r:
            cells += ["error", "-"]
        else:
            bad = "" if r["ok"] else " (rel err %.1e)" % r["rel_err"]
            cells.append("%.1f%s" % (r["us"], bad))
            cells.append("%.2f" % (r["us"] / ours) if side != "ours" and ours else "%.0f" % (rec["flops"] / r["us"] / 1e6))
    cells.append("%.1f" % rec["ours"].get("host_us_per_call", float("nan")))
    return "| " + " | ".join(cells) + " |"


def host_cost(calls=300):
    """The package's host time per call, as `blockscaled-run --engine` measures the Rust call's:
    16 × 7168 × 2048 FP8 in DeepGEMM's layouts (A's scales M-major), the same tensors every
    call, `calls` calls enqueued without waiting after a warm-up; beside it, torch's current
    stream looked up alone and the call with the stream given."""
    import time
    import torch as t
    import blockscaled as bs

    m, n, k = 16, 7168, 2048
    a = t.randn(m, k, device="cuda").to(t.float8_e4m3fn)
    sfa = (t.rand(k // 128, m, device="cuda") + 0.5).t()
    b = t.randn(n, k, device="cuda").to(t.float8_e4m3fn)
    sfb = t.rand(n // 128, k // 128, device="cuda") + 0.5
    out = t.empty(m, n, device="cuda", dtype=t.bfloat16)
    raw = t.cuda.current_stream().cuda_stream

    def each(what, f):
        for _ in range(20):
            f()
        t.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        us = (time.perf_counter() - t0) * 1e6 / calls
        t.cuda.synchronize()
        print("  %-52s %8.2f µs" % (what, us))
        return us

    print("host time per call (%d×%d×%d FP8, DeepGEMM's layouts, %d calls):" % (m, n, k, calls))
    each("an empty Python call", lambda: None)
    each("torch.cuda.current_stream().cuda_stream", lambda: t.cuda.current_stream().cuda_stream)
    each("fp8_gemm_nt(a, sfa, b, sfb, out, stream=raw)", lambda: bs.fp8_gemm_nt(a, sfa, b, sfb, out, stream=raw))
    each("fp8_gemm_nt(a, sfa, b, sfb, out)", lambda: bs.fp8_gemm_nt(a, sfa, b, sfb, out))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host-cost", action="store_true", help="the host time per call alone")
    ap.add_argument("--cases", default="all")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", help="append one JSON object a line per case")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.host_cost:
        return host_cost()
    if args.list:
        print("\n".join(c[0] for c in CASES))
        return 0
    names = [c[0] for c in CASES] if args.cases == "all" else args.cases.split(",")
    unknown = [x for x in names if x not in {c[0] for c in CASES}]
    if unknown:
        sys.exit("unknown case(s): %s" % ", ".join(unknown))
    s = Sides(args)
    print("blockscaled %s, torch %s, DeepGEMM %s on %s; %d warm-up, median of %d" % (
        s.bs.__version__, s.torch.__version__,
        getattr(s.dg, "__version__", "?") if s.dg else "not importable (%s)" % s.dg_missing,
        s.gpu, args.warmup, args.iters))
    print("| case | ours µs | TFLOP/s | torch µs | torch/ours | DeepGEMM µs | DG/ours | ours host µs per call |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    failed, paths = False, set()
    for name, kind, spec in CASES:
        if name not in names:
            continue
        rec = s.run(name, kind, spec)
        print(row(rec), flush=True)
        for side in ("ours", "torch", "DeepGEMM"):
            r = rec.get(side) or {}
            failed |= "error" in r or r.get("ok") is False
            if "path" in r:
                paths.add(r["path"])
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(rec) + "\n")
    print("torch: " + "; ".join(sorted(paths)) + ". X/ours: X's time over ours (above 1: ours is faster).")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
