"""The peer for the device quantizers (issue 16): the same quantizations written in torch,
timed on the GPU with CUDA events (warm-up, median, rotated inputs), eager and torch.compile.

    python3 benches/peers/torch_quantize.py [--iters 50] [--no-compile]

Prints one line per format × shape × mode: median µs and GB/s (input + codes + scales, the
bytes blockscaled's quantizer table counts). The formats follow blockscaled's quantizers:
- deepseek-fp8: e4m3 codes, fp32 scale per 1 × 128 (amax / 448, x / scale rounded to nearest even);
- fp8-row: e4m3 codes, one fp32 scale per row;
- mxfp8: e4m3 codes, e8m0 scale per 32 (OCP: 2^(floor(log2 amax) - 8)), scales as uint8.
"""
import argparse
import statistics

import torch

FP8_MAX = 448.0


def deepseek_fp8(x):
    m, k = x.shape
    b = x.float().view(m, k // 128, 128)
    amax = b.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    scale = amax / FP8_MAX
    q = (b / scale).to(torch.float8_e4m3fn).view(m, k)
    return q, scale.view(m, k // 128)


def fp8_row(x):
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True).clamp_min(1e-30)
    scale = amax / FP8_MAX
    return (xf / scale).to(torch.float8_e4m3fn), scale


def mxfp8(x):
    m, k = x.shape
    b = x.float().view(m, k // 32, 32)
    amax = b.abs().amax(-1, keepdim=True).clamp_min(2.0**-126)
    e = torch.floor(torch.log2(amax)) - 8
    q = (b * torch.exp2(-e)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(m, k)
    return q, (e + 127).to(torch.uint8).view(m, k // 32)


FORMATS = {
    "deepseek-fp8": (deepseek_fp8, lambda m, k: m * k + m * (k // 128) * 4),
    "fp8-row": (fp8_row, lambda m, k: m * k + m * 4),
    "mxfp8": (mxfp8, lambda m, k: m * k + m * (k // 32)),
}


def time_us(fn, inputs, iters, warmup=10):
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(inputs[i % len(inputs)])
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    for name, (fn, out_bytes) in FORMATS.items():
        modes = [("eager", fn)]
        if not args.no_compile:
            modes.append(("compile", torch.compile(fn, dynamic=False)))
        for m, k in [(4096, 7168), (16, 7168)]:
            sets = 4 if m >= 1024 else 16
            for dtype in [torch.bfloat16, torch.float32]:
                inputs = [torch.randn(m, k, device="cuda", dtype=dtype) for _ in range(sets)]
                nbytes = m * k * inputs[0].element_size() + out_bytes(m, k)
                for mode, f in modes:
                    us = time_us(f, inputs, args.iters)
                    dt = str(dtype).replace("torch.", "")
                    print(f"{name:13} {dt:8} {m:5}x{k:<5} {mode:7} {us:9.1f} us {nbytes / us / 1e3:7.0f} GB/s")


if __name__ == "__main__":
    main()
