"""The package on a GPU, against torch: DeepSeek FP8 GEMMs with DeepGEMM's layouts checked
element by element against torch's product of the dequantized operands, on torch's current
stream, and bad tensors raising clear errors. Skipped without torch or a CUDA device."""

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

import blockscaled as bs  # noqa: E402

E4M3_MAX = 448.0

def quantize_rows(x):
    """1x128 blocks (activations): fp32 scale per row and 128 columns."""
    m, k = x.shape
    blocks = x.view(m, k // 128, 128)
    scale = blocks.abs().amax(dim=2).clamp(min=1e-12) / E4M3_MAX
    codes = (blocks / scale[:, :, None]).to(torch.float8_e4m3fn).view(m, k)
    return codes, scale

def quantize_blocks(w):
    """128x128 blocks (weights)."""
    n, k = w.shape
    blocks = w.view(n // 128, 128, k // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / E4M3_MAX
    codes = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view(n, k)
    return codes, scale

def dequantized(codes, scale, rows_per_block):
    f = codes.float()
    s = scale.repeat_interleave(rows_per_block, 0).repeat_interleave(128, 1)
    return f * s[: f.shape[0]]

def check(m, n, k, out_dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g)
    b = torch.randn(n, k, device="cuda", generator=g)
    a8, sa = quantize_rows(a)
    b8, sb = quantize_blocks(b)
    # DeepGEMM's M-major A scales: shape (M, K/128), strides (1, M).
    sfa = sa.t().contiguous().t()
    out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
    bs.fp8_gemm_nt(a8, sfa, b8, sb, out)
    torch.cuda.current_stream().synchronize()
    fa, fb = dequantized(a8, sa, 1), dequantized(b8, sb, 128)
    ref = (fa.double() @ fb.double().t())
    mag = fa.abs().double() @ fb.abs().double().t()
    # FP8 products accumulated in the tensor cores' precision (2^-7 of sum |a·b|), then rounded
    # to the output type.
    out_rel = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
    tol = 2.0**-7 * mag + out_rel[out_dtype] * ref.abs()
    got = out.double()
    assert torch.isfinite(got).all(), "NaN or Inf in the output (poisoned with NaN)"
    err = (got - ref).abs()
    worst = (err / tol).max().item()
    assert worst <= 1.0, f"{m}x{n}x{k} {out_dtype}: error {worst:.3f} of the bound"

@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m,n,k", [(256, 512, 1024), (200, 384, 512), (16, 7168, 2048)])
def test_fp8_gemm_nt_matches_torch_on_the_dequantized_operands(m, n, k, out_dtype):
    check(m, n, k, out_dtype, seed=m * 7 + n + k)

def test_calls_run_on_torchs_current_stream():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        check(256, 512, 1024, torch.bfloat16, seed=5)

def test_bad_tensors_raise_clear_errors():
    m, n, k = 128, 256, 512
    a8, sa = quantize_rows(torch.randn(m, k, device="cuda"))
    b8, sb = quantize_blocks(torch.randn(n, k, device="cuda"))
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="a: dtype"):
        bs.fp8_gemm_nt(a8.to(torch.bfloat16), sa, b8, sb, out)
    with pytest.raises(ValueError, match="contiguous"):
        bs.fp8_gemm_nt(a8.t().contiguous().t(), sa, b8, sb, out)
    with pytest.raises(ValueError, match="CUDA tensor"):
        bs.fp8_gemm_nt(a8, sa, b8, sb, out.cpu())
    with pytest.raises(ValueError, match="contiguous"):
        bs.fp8_gemm_nt(a8, sa, b8, sb, out[:, :128])
    narrow = torch.empty(m, n // 2, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="does not give out"):
        bs.fp8_gemm_nt(a8, sa, b8, sb, narrow)
    with pytest.raises(bs.ShapeError):
        bs.fp8_gemm_nt(a8, sa[:, :2], b8, sb, out)
