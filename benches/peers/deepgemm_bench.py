"""The DeepGEMM peer: DeepGEMM's FP8 GEMMs (e4m3 operands, fp32 scales per 1 × 128 of the
activations and per 128 × 128 of the weights, bf16 output) on the shapes the comparison with
blockscaled uses, timed the way blockscaled's harness times its own kernels (benches/src/timing.rs):

- CUDA events around each launch, warm-up launches first, the median of the timed ones;
- the timed launches enqueued behind a closed stream (here a spin kernel long enough to cover the
  host's enqueueing, checked after the fact), so a launch path slower than the kernel (DeepGEMM's
  Python call picks its config and builds its TMA descriptors on every call) is not timed as GPU
  time;
- operand sets rotated so that together they cover at least 4 × L2 (at most 16 sets): each launch
  reads its operands from DRAM, not from L2 left warm by the previous one. blockscaled's grouped
  mode times one set (its experts are the bulk of the bytes); grouped cases here are also timed
  that way (`us_one_set`).

Scales are put into the layout DeepGEMM's kernels read before timing (`get_mn_major_tma_aligned_tensor`
for the activations' scales; the weights' 128 × 128 scales are read as they are), so the timed call
launches the GEMM alone; --jit-only lists what one call launches (torch profiler; never in a timing
process) to show it.

Every result is checked against an fp32 torch product of the dequantized operands (the relative
Frobenius error of the bf16 output; above 1e-2 the case fails). Inputs are torch.randn (fixed seed).

    python3 benches/peers/deepgemm_bench.py [--cases all|dense|grouped|NAME,...] [--iters 50]
        [--warmup 10] [--seed 0] [--json PATH] [--jit-only] [--list] [--list-dense]

Needs torch with CUDA and an installed deep_gemm (scripts/deepgemm-compare.sh builds one from
source). Prints a table; with --json, appends one JSON object a line per case.
"""
import argparse
import glob
import json
import os
import sys
import time

from harness import Timer

# The large DeepSeek FP8 shapes, M × N × K.
DENSE = [
    (8192, 8192, 8192),
    (4096, 7168, 16384),
    (2048, 8192, 28672),
    (4096, 5120, 13824),
]

# blockscaled's grouped seed cases (benches/src/grouped.rs SEED_CASES): rows per group, N, K. Its
# runner runs them in the contiguous layout (`--group_case N`, no --masked): all groups' rows in
# one M × K tensor. Here they run through m_grouped_fp8_gemm_nt_contiguous, whose layout pads each
# group to get_mk_alignment_for_contiguous_layout() rows (128 on SM90) and marks the padding rows
# -1 in the row → group index. FLOPs count the groups' own rows only (2 · Σ rows · N · K, as
# blockscaled's runner counts them): the padding rows are work DeepGEMM's layout adds, not work
# the product needs, so they show up as time, not as FLOPs.
SEED_CASES = [
    ([80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168),
    ([40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048),
    ([192, 320], 3072, 4096),
    ([128, 384], 4096, 1536),
]

MAX_REL_ERR = 1e-2


def cases():
    """(name, kind, spec) of every case, dense first."""
    out = [("dense-%dx%dx%d" % s, "dense", s) for s in DENSE]
    out += [("grouped-%d" % (i + 1), "grouped", c) for i, c in enumerate(SEED_CASES)]
    return out


def select(spec):
    every = cases()
    if spec == "all":
        return every
    if spec in ("dense", "grouped"):
        return [c for c in every if c[1] == spec]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    known = {c[0]: c for c in every}
    missing = [n for n in names if n not in known]
    if missing:
        sys.exit("unknown case(s) %s; cases: %s" % (", ".join(missing), " ".join(known)))
    return [known[n] for n in names]


def import_deep_gemm():
    """deep_gemm, importable. Its extension links libnvrtc (the JIT compiles with it, or asks it
    its version); torch does not always have one loaded and the toolkit's lib64 is not always on
    the loader's path, so on that failure the toolkit's libnvrtc is loaded first and the import
    retried."""
    try:
        import deep_gemm

        return deep_gemm
    except ImportError as e:
        if "libnvrtc" not in str(e):
            raise
        import ctypes

        home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        for d in ("lib64", "lib", "targets/x86_64-linux/lib"):
            for p in sorted(glob.glob(os.path.join(home, d, "libnvrtc.so.*"))):
                try:
                    ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
                import deep_gemm

                return deep_gemm
        raise


class Bench(Timer):
    """torch, deep_gemm and the timing helpers (harness.Timer), set up once per process."""

    def __init__(self, args):
        Timer.__init__(self, args.warmup, args.iters)
        self.args = args
        self.dg = import_deep_gemm()
        from deep_gemm import utils as dgu

        self.dgu = dgu
        self.jit = "nvrtc" if os.environ.get("DG_JIT_USE_NVRTC", "0") not in ("", "0") else "nvcc"

    def kernels(self, launch):
        """The device activities of one call (kernels, memsets, copies), by name."""
        t = self.torch
        try:
            from torch.profiler import ProfilerActivity, profile

            t.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                launch(0)
                t.cuda.synchronize()
            names = [e.name for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
            return [n if len(n) <= 120 else n[:117] + "..." for n in names]
        except Exception as x:  # the listing is a report, not a requirement
            return ["(not listed: %s)" % x]

    # Operands.

    def quantize_a(self, x):
        """1 × 128 activation quantization: e4m3 codes and fp32 scales (rows, K / 128)."""
        return self.dgu.per_token_cast_to_fp8(x, use_ue8m0=False)

    def quantize_b(self, x):
        """128 × 128 weight quantization: e4m3 codes and fp32 scales (N / 128, K / 128)."""
        return self.dgu.per_block_cast_to_fp8(x, use_ue8m0=False)

    def sfa_layout(self, sfa):
        """The activations' scales in the layout the SM90 kernels read (MN-major, rows padded to
        the TMA alignment): given so, the GEMM call transforms nothing before its kernel."""
        return self.dgu.get_mn_major_tma_aligned_tensor(sfa)

    def dequant_a(self, a, sfa, k):
        return a.float() * sfa.repeat_interleave(128, dim=-1)[..., :k]

    def dequant_b(self, b, sfb, n, k):
        s = sfb.repeat_interleave(128, dim=-2)[..., :n, :].repeat_interleave(128, dim=-1)[..., :k]
        return b.float() * s

    @staticmethod
    def nbytes(*ts):
        return sum(x.numel() * x.element_size() for x in ts)

    # Cases.

    def dense(self, m, n, k, seed, jit_only):
        t, bf16 = self.torch, self.torch.bfloat16
        t.manual_seed(seed)
        a, sfa = self.quantize_a(t.randn(m, k, device="cuda", dtype=bf16))
        b, sfb = self.quantize_b(t.randn(n, k, device="cuda", dtype=bf16))
        d = t.empty(m, n, device="cuda", dtype=bf16)
        sets = 1 if jit_only else self.rotation(self.nbytes(a, sfa, b, sfb, d))
        ops = [(a, self.sfa_layout(sfa), b, sfb, d)]
        for _ in range(sets - 1):
            ops.append((a.clone(), self.sfa_layout(sfa), b.clone(), sfb.clone(), t.empty_like(d)))

        def launch(i):
            x, sx, y, sy, out = ops[i]
            self.dg.fp8_gemm_nt((x, sx), (y, sy), out, disable_ue8m0_cast=True)

        def check():
            d.fill_(float("nan"))
            launch(0)
            ref = self.dequant_a(a, sfa, k) @ self.dequant_b(b, sfb, n, k).t()
            return rel_err(t, d, ref)

        return {
            "kind": "dense",
            "m": m,
            "n": n,
            "k": k,
            "flops": 2.0 * m * n * k,
            "sets": sets,
            "launch": launch,
            "check": check,
        }

    def grouped(self, sizes, n, k, seed, jit_only):
        t, bf16 = self.torch, self.torch.bfloat16
        t.manual_seed(seed)
        g = len(sizes)
        align_m = self.dgu.get_mk_alignment_for_contiguous_layout()
        padded = [self.dgu.align(s, align_m) for s in sizes]
        rows = sum(padded)
        # Padding rows are zeros (their scales then regular) and marked -1: no group's.
        a_bf = t.zeros(rows, k, device="cuda", dtype=bf16)
        index = t.full((rows,), -1, device="cuda", dtype=t.int32)
        starts, off = [], 0
        for i, (s, p) in enumerate(zip(sizes, padded)):
            a_bf[off : off + s] = t.randn(s, k, device="cuda", dtype=bf16)
            index[off : off + s] = i
            starts.append(off)
            off += p
        a, sfa = self.quantize_a(a_bf)
        del a_bf
        b = t.empty(g, n, k, device="cuda", dtype=t.float8_e4m3fn)
        sfb = t.empty(g, -(-n // 128), -(-k // 128), device="cuda", dtype=t.float32)
        for i in range(g):
            b[i], sfb[i] = self.quantize_b(t.randn(n, k, device="cuda", dtype=bf16))
        d = t.empty(rows, n, device="cuda", dtype=bf16)
        sets = 1 if jit_only else self.rotation(self.nbytes(a, sfa, b, sfb, d, index))
        ops = [(a, self.sfa_layout(sfa), b, sfb, d, index)]
        for _ in range(sets - 1):
            ops.append((a.clone(), self.sfa_layout(sfa), b.clone(), sfb.clone(), t.empty_like(d), index.clone()))

        def launch(i):
            x, sx, y, sy, out, idx = ops[i]
            self.dg.m_grouped_fp8_gemm_nt_contiguous((x, sx), (y, sy), out, idx, disable_ue8m0_cast=True)

        def check():
            d.fill_(float("nan"))
            launch(0)
            num, den = 0.0, 0.0
            for i, (s, start) in enumerate(zip(sizes, starts)):
                if s == 0:
                    continue
                r = slice(start, start + s)
                ref = self.dequant_a(a[r], sfa[r], k) @ self.dequant_b(b[i], sfb[i], n, k).t()
                diff = d[r].float() - ref
                num += float((diff * diff).sum())
                den += float((ref * ref).sum())
            return (num / den) ** 0.5 if den > 0 else float("nan")

        return {
            "kind": "grouped",
            "groups": list(sizes),
            "rows": sum(sizes),
            "padded_rows": rows,
            "alignment": align_m,
            "m": sum(sizes),
            "n": n,
            "k": k,
            "flops": 2.0 * sum(sizes) * n * k,
            "sets": sets,
            "launch": launch,
            "check": check,
        }

    def run(self, name, kind, spec, seed, jit_only):
        c = self.dense(*spec, seed, jit_only) if kind == "dense" else self.grouped(*spec, seed, jit_only)
        launch = c.pop("launch")
        check = c.pop("check")
        rec = {"tool": "deepgemm", "name": name, **c}
        # The first call compiles the kernel (or loads it from DG_JIT_CACHE_DIR).
        t0 = time.perf_counter()
        launch(0)
        self.torch.cuda.synchronize()
        rec["first_call_s"] = time.perf_counter() - t0
        if jit_only:
            # Listed here, in the compiling process: the timing process never starts the profiler.
            rec["kernels"] = self.kernels(launch)
            return rec
        err = check()
        rec["rel_err"] = err
        rec["ok"] = err == err and err <= MAX_REL_ERR
        rec.update(self.time_launches(launch, c["sets"]))
        rec["tflops"] = c["flops"] / (rec["us"] * 1e-6) / 1e12
        if kind == "grouped" and c["sets"] > 1:
            one = self.time_launches(launch, 1)
            rec["us_one_set"] = one["us"]
            rec["gate_one_set"] = one["gate"]
        elif kind == "grouped":
            rec["us_one_set"] = rec["us"]
        rec.update(
            {
                "gpu": self.gpu,
                "l2_bytes": self.l2,
                "deep_gemm": getattr(self.dg, "__version__", "?"),
                "torch": self.torch.__version__,
                "jit": self.jit,
                "iters": self.args.iters,
                "warmup": self.args.warmup,
            }
        )
        return rec


def rel_err(torch, got, ref):
    """‖got − ref‖ / ‖ref‖ (Frobenius, fp32; NaN where an element was not written)."""
    diff = got.float() - ref
    den = torch.linalg.vector_norm(ref)
    return float(torch.linalg.vector_norm(diff) / den) if float(den) > 0 else float("nan")


def shape_of(r):
    if r["kind"] == "dense":
        return "%dx%dx%d" % (r["m"], r["n"], r["k"])
    return "G=%d rows %d (%d padded) N=%d K=%d" % (len(r["groups"]), r["rows"], r["padded_rows"], r["n"], r["k"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="all", help="all, dense, grouped or a comma list of names (--list)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="append one JSON object a line per case to this file")
    ap.add_argument("--jit-only", action="store_true", help="one untimed, unchecked call per case (compiles the kernels)")
    ap.add_argument("--list", action="store_true", help="print the case names")
    ap.add_argument("--list-dense", action="store_true", help="print the dense shapes as M,N,K,1")
    ap.add_argument("--import-check", action="store_true", help="import deep_gemm and print where from")
    args = ap.parse_args()
    if args.list:
        print("\n".join(c[0] for c in cases()))
        return 0
    if args.list_dense:
        print("\n".join("%d,%d,%d,1" % s for s in DENSE))
        return 0
    if args.import_check:
        dg = import_deep_gemm()
        print("deep_gemm %s from %s" % (getattr(dg, "__version__", "?"), os.path.dirname(dg.__file__)))
        return 0

    selected = select(args.cases)
    b = Bench(args)
    if not args.jit_only:
        print(
            "DeepGEMM %s on %s (torch %s, JIT %s, L2 %d MiB); %d warm-up, median of %d"
            % (getattr(b.dg, "__version__", "?"), b.gpu, b.torch.__version__, b.jit, b.l2 >> 20, args.warmup, args.iters)
        )
    wanted = {c[0] for c in selected}
    recs, failed = [], False
    for i, (name, kind, spec) in enumerate(cases()):
        if name not in wanted:
            continue
        try:
            r = b.run(name, kind, spec, args.seed + i, args.jit_only)
        except Exception as x:
            failed = True
            print("%s: ERROR: %s: %s" % (name, type(x).__name__, x), flush=True)
            continue
        finally:
            b.torch.cuda.empty_cache()
        if args.jit_only:
            ks = r["kernels"]
            alone = len(ks) == 1 and "gemm" in ks[0].lower()
            print(
                "%s: first call %.1f s (JIT %s); one call launches%s: %s"
                % (name, r["first_call_s"], b.jit, "" if alone else " (more than the GEMM: timed with it)", "; ".join(ks)),
                flush=True,
            )
            continue
        if not r["ok"]:
            failed = True
            print(
                "%s: CHECK FAILED: relative error %.3e against the fp32 product of the dequantized operands "
                "(limit %.0e)" % (name, r["rel_err"], MAX_REL_ERR),
                flush=True,
            )
        if r["gate"] != "held":
            print("%s: gate %s: host launch time may be in the timing" % (name, r["gate"]), flush=True)
        print(
            "%s: %.1f µs, %.0f TFLOP/s, rel err %.2e, %d set(s), first call %.1f s"
            % (name, r["us"], r["tflops"], r["rel_err"], r["sets"], r["first_call_s"]),
            flush=True,
        )
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
        recs.append(r)
    if recs:
        print()
        print("%-14s %-40s %5s %10s %10s %8s %9s" % ("case", "shape", "sets", "µs", "1-set µs", "TFLOP/s", "rel err"))
        for r in recs:
            one = "%.1f" % r["us_one_set"] if "us_one_set" in r else "-"
            print(
                "%-14s %-40s %5d %10.1f %10s %8.0f %9.2e%s"
                % (r["name"], shape_of(r), r["sets"], r["us"], one, r["tflops"], r["rel_err"], "" if r["ok"] else "  FAILED")
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
