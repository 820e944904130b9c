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

OUT_REL = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}

def assert_product(got, fa, fb, out_dtype, what):
    """Every element of `got` within the FP8 products' bound of `fa · fbᵀ` (as `check`)."""
    ref = fa.double() @ fb.double().t()
    mag = fa.abs().double() @ fb.abs().double().t()
    tol = 2.0**-7 * mag + OUT_REL[out_dtype] * ref.abs()
    got = got.double()
    assert torch.isfinite(got).all(), f"{what}: NaN or Inf in rows the call writes"
    worst = ((got - ref).abs() / tol).max().item() if got.numel() else 0.0
    assert worst <= 1.0, f"{what}: error {worst:.3f} of the bound"

def experts(g, n, k, gen):
    """G experts (G, N, K) FP8 with (G, N/128, K/128) scales, and their dequantized values."""
    codes, scales, values = [], [], []
    for _ in range(g):
        b8, sb = quantize_blocks(torch.randn(n, k, device="cuda", generator=gen))
        codes.append(b8)
        scales.append(sb)
        values.append(dequantized(b8, sb, 128))
    return torch.stack(codes), torch.stack(scales), values

@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_contiguous_groups_by_offs_match_torch_and_leave_the_rows_past_the_last_end(out_dtype):
    gen = torch.Generator(device="cuda").manual_seed(21)
    n, k, rows = 256, 512, [37, 0, 150, 81]
    r = sum(rows) + 32  # 32 rows past the last end: not written
    b8, sb, fb = experts(len(rows), n, k, gen)
    a8, sa = quantize_rows(torch.randn(r, k, device="cuda", generator=gen))
    fa = dequantized(a8, sa, 1)
    offs = torch.tensor(rows, device="cuda").cumsum(0).to(torch.int32)
    out = torch.full((r, n), float("nan"), device="cuda", dtype=out_dtype)
    bs.m_grouped_fp8_gemm_nt_contiguous(a8, sa.t().contiguous().t(), b8, sb, out, offs)
    torch.cuda.current_stream().synchronize()
    start = 0
    for g, end in enumerate(offs.tolist()):
        assert_product(out[start:end], fa[start:end], fb[g], out_dtype, f"group {g}")
        start = end
    assert torch.isnan(out[start:].float()).all(), "rows past the last end were written"

def test_contiguous_groups_by_m_indices_match_torch_on_every_real_row():
    # DeepGEMM's layout: each group's rows padded to 128 with -1.
    gen = torch.Generator(device="cuda").manual_seed(22)
    n, k, rows = 256, 512, [100, 0, 128, 3]
    b8, sb, fb = experts(len(rows), n, k, gen)
    index = []
    for g, m in enumerate(rows):
        index += [g] * m + [-1] * ((-m) % 128)
    m_indices = torch.tensor(index, device="cuda", dtype=torch.int32)
    r = len(index)
    a8, sa = quantize_rows(torch.randn(r, k, device="cuda", generator=gen))
    fa = dequantized(a8, sa, 1)
    out = torch.full((r, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bs.m_grouped_fp8_gemm_nt_contiguous(a8, sa, b8, sb, out, m_indices=m_indices)
    torch.cuda.current_stream().synchronize()
    for g in range(len(rows)):
        real = (m_indices == g).nonzero().flatten()
        assert_product(out[real], fa[real], fb[g], torch.bfloat16, f"group {g}")
    ends = bs.offs_of_m_indices(m_indices, len(rows)).tolist()
    assert ends == [100, 100, 256, 259], ends
    with pytest.raises(ValueError, match="group order"):
        bs.offs_of_m_indices(m_indices.flip(0), len(rows))
    with pytest.raises(ValueError, match="outside"):
        bs.offs_of_m_indices(m_indices + 1, len(rows))

def test_masked_groups_match_torch_and_leave_the_rows_past_each_count():
    gen = torch.Generator(device="cuda").manual_seed(23)
    n, k, cap, counts = 256, 512, 128, [5, 0, 128, 77]
    g = len(counts)
    b8, sb, fb = experts(g, n, k, gen)
    a = torch.randn(g, cap, k, device="cuda", generator=gen)
    coded = [quantize_rows(a[i]) for i in range(g)]
    a8 = torch.stack([c for c, _ in coded])
    sa = torch.stack([s for _, s in coded])
    out = torch.full((g, cap, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    masked_m = torch.tensor(counts, device="cuda", dtype=torch.int32)
    bs.m_grouped_fp8_gemm_nt_masked(a8, sa, b8, sb, out, masked_m, expected_m=64)
    torch.cuda.current_stream().synchronize()
    for i, m in enumerate(counts):
        fa = dequantized(coded[i][0], coded[i][1], 1)
        assert_product(out[i, :m], fa[:m], fb[i], torch.bfloat16, f"group {i}")
        assert torch.isnan(out[i, m:].float()).all(), f"group {i}: rows past its count written"

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("column_major", [False, True])
def test_the_fp8_quantizer_matches_amax_scaling_and_feeds_the_gemm(dtype, column_major):
    gen = torch.Generator(device="cuda").manual_seed(31)
    m, n, k = 200, 256, 512
    x = (torch.randn(m, k, device="cuda", generator=gen) * 3).to(dtype)
    codes, scales = bs.per_token_group_quant_fp8(x, column_major_scales=column_major)
    torch.cuda.current_stream().synchronize()
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == x.shape
    assert scales.shape == (m, k // 128)
    assert (scales.stride() == (1, m)) == column_major
    # The scale of each row and 128 columns: its largest magnitude over 448, the quotient
    # rounded once (torch divides a CUDA tensor by a scalar as a product with the scalar's
    # reciprocal, which can be one ulp off; the quotient of two floats in float64, rounded to
    # float32, is the correctly rounded one: 448 = 7 · 2^6, so the float64 quotient is never a
    # float32 halfway point).
    amax = x.float().view(m, k // 128, 128).abs().amax(dim=2)
    want = (amax.double() / E4M3_MAX).float()
    assert torch.equal(scales, want), (scales - want).abs().max()
    # Each code within half a step of e4m3 (3 significand bits; subnormals from 2^-6) of x / scale.
    xs = x.float() / scales.repeat_interleave(128, 1)
    got = codes.float()
    assert torch.isfinite(got).all()
    bound = 2.0**-4 * xs.abs() + 2.0**-10
    assert ((got - xs).abs() <= bound).all(), ((got - xs).abs() / bound).max()
    # And the GEMM takes them as they are.
    b8, sb = quantize_blocks(torch.randn(n, k, device="cuda", generator=gen))
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    bs.fp8_gemm_nt(codes, scales, b8, sb, out)
    torch.cuda.current_stream().synchronize()
    assert_product(out, dequantized(codes, scales.contiguous(), 1), dequantized(b8, sb, 128),
                   torch.bfloat16, "the quantizer's codes in the GEMM")

@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_the_mxfp8_quantizer_gives_power_of_two_scales_and_codes_within_the_format(fp8):
    gen = torch.Generator(device="cuda").manual_seed(41)
    m, k = 96, 512
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 5
    codes, scales = bs.quantize_mxfp8(x, fp8)
    torch.cuda.current_stream().synchronize()
    assert codes.shape == x.shape and scales.shape == (m, k // 32)
    assert scales.dtype == torch.float8_e8m0fnu
    s = scales.float()
    assert torch.isfinite(s).all() and (s > 0).all()
    assert torch.equal(torch.exp2(torch.log2(s).round()), s), "scales are powers of two"
    deq = codes.float().view(m, k // 32, 32) * s[:, :, None]
    xb = x.float().view(m, k // 32, 32)
    amax = xb.abs().amax(dim=2, keepdim=True)
    # A power-of-two scale leaves the block's largest value at most an eighth past the largest
    # code (e4m3: 448 of [256, 512); e5m2: 57344 of [32768, 65536)), and rounding loses at most
    # half a step (2^-4 of the value for e4m3, 2^-3 for e5m2): every element within amax / 4.
    assert ((deq - xb).abs() <= amax / 4).all(), ((deq - xb).abs() / amax).max()


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def random_fp4(rows, k, gen):
    """Random e2m1 codes, two a byte (the first in the low nibble), and their values."""
    u8 = torch.randint(0, 256, (rows, k // 2), device="cuda", generator=gen, dtype=torch.uint8)
    nib = torch.stack([u8 & 0xF, u8 >> 4], dim=2).view(rows, k).long()
    table = torch.tensor(E2M1, device="cuda", dtype=torch.float64)
    vals = table[nib & 7] * torch.where(nib >= 8, -1.0, 1.0).double()
    return u8.view(torch.float4_e2m1fn_x2), vals


def random_e8m0(rows, blocks, gen):
    """Random power-of-two scales (2^-3 .. 2^3) and their values."""
    u8 = torch.randint(124, 131, (rows, blocks), device="cuda", generator=gen, dtype=torch.uint8)
    return u8.view(torch.float8_e8m0fnu), torch.exp2(u8.double() - 127)


def operand(kind, rows, k, gen, as_b):
    """Codes, scales (None for bf16) and the dequantized values of one operand of `kind`."""
    if kind in ("mxfp4", "e2m1x16", "nvfp4"):
        codes, vals = random_fp4(rows, k, gen)
        per = 32 if kind == "mxfp4" else 16
        if kind == "nvfp4":
            s = (torch.rand(rows, k // per, device="cuda", generator=gen) * 3 + 0.5).to(torch.float8_e4m3fn)
            sv = s.double()
        else:
            s, sv = random_e8m0(rows, k // per, gen)
        return codes, s, vals * sv.repeat_interleave(per, 1)
    if kind == "mxfp8":
        codes = (torch.randn(rows, k, device="cuda", generator=gen) * 8).to(torch.float8_e4m3fn)
        s, sv = random_e8m0(rows, k // 32, gen)
        return codes, s, codes.double() * sv.repeat_interleave(32, 1)
    if kind == "bf16":
        x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
        return x, None, x.double()
    if kind == "fp8":  # DeepSeek: 1x128 (A) or 128x128 (B)
        x = torch.randn(rows, k, device="cuda", generator=gen)
        codes, s = quantize_blocks(x) if as_b else quantize_rows(x)
        return codes, s, dequantized(codes, s, 128 if as_b else 1).double()
    raise ValueError(kind)


@pytest.mark.parametrize("m,n,k", [(16, 256, 512), (100, 384, 1024)])
@pytest.mark.parametrize(
    "ka,kb",
    [("mxfp4", "mxfp4"), ("e2m1x16", "e2m1x16"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"),
     ("bf16", "mxfp4"), ("bf16", "nvfp4"), ("fp8", "mxfp4"), ("fp8", "nvfp4"), ("fp8", "fp8")],
)
def test_gemm_nt_matches_torch_on_the_dequantized_operands_for_every_format(ka, kb, m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(hash((ka, kb, m)) % 2**31)
    a, sfa, fa = operand(ka, m, k, gen, False)
    b, sfb, fb = operand(kb, n, k, gen, True)
    ga = 0.5 if ka == "nvfp4" else 1.0
    gb = 2.0 if kb == "nvfp4" else 1.0
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.gemm_nt(a, sfa, b, sfb, out, a_global_scale=ga, b_global_scale=gb)
    torch.cuda.current_stream().synchronize()
    ref = (fa @ fb.t()) * (ga * gb)
    mag = (fa.abs() @ fb.abs().t()) * (ga * gb)
    # The loosest of the kernels the plan may pick: FP8 tensor-core sums (2^-7 of sum |a·b|),
    # then the fp32 output's rounding.
    tol = 2.0**-7 * mag + 2.0**-23 * ref.abs() + 1e-30
    got = out.double()
    assert torch.isfinite(got).all(), "NaN or Inf in the output (poisoned with NaN)"
    worst = ((got - ref).abs() / tol).max().item()
    assert worst <= 1.0, f"{ka} x {kb} {m}x{n}x{k}: error {worst:.3f} of the bound"


def test_the_128x4_swizzled_layout_is_the_formula_and_round_trips():
    gen = torch.Generator(device="cuda").manual_seed(44)
    for rows, kb, batch in [(200, 7, None), (128, 4, 2), (1, 9, None)]:
        l = 1 if batch is None else batch
        grid = torch.randint(0, 255, (l, rows, kb), device="cuda", generator=gen, dtype=torch.uint8)
        flat = bs.swizzle_scales_128x4(grid if batch else grid[0]).cpu()
        rt, ct = -(-rows // 128), -(-kb // 4)
        assert flat.numel() == l * rt * ct * 512
        want = torch.zeros(l * rt * ct * 512, dtype=torch.uint8)
        g = grid.cpu()
        for b in range(l):
            for r in range(rows):
                for c in range(kb):
                    tile = (b * rt + r // 128) * ct + c // 4
                    rr, cc = r % 128, c % 4
                    want[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc] = g[b, r, c]
        assert torch.equal(flat, want), f"{rows} x {kb} x {batch}"
        back = bs.unswizzle_scales_128x4(flat.cuda(), rows, kb, batch)
        assert torch.equal(back.cpu(), g if batch else g[0])


@pytest.mark.parametrize("ka,kb", [("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp8"), ("bf16", "mxfp4")])
def test_gemm_nt_takes_scales_in_the_128x4_swizzled_layout(ka, kb):
    gen = torch.Generator(device="cuda").manual_seed(45)
    m, n, k = 200, 384, 512
    a, sfa, _ = operand(ka, m, k, gen, False)
    b, sfb, _ = operand(kb, n, k, gen, True)
    ga, gb = (0.5, 2.0) if ka == "nvfp4" else (1.0, 1.0)
    want = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.gemm_nt(a, sfa, b, sfb, want, a_global_scale=ga, b_global_scale=gb)
    swa = None if sfa is None else bs.swizzle_scales_128x4(sfa)
    got = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.gemm_nt(a, swa, b, bs.swizzle_scales_128x4(sfb), got, a_global_scale=ga, b_global_scale=gb,
               scale_layout="128x4")
    torch.cuda.current_stream().synchronize()
    assert torch.isfinite(got).all()
    assert torch.equal(got, want), f"{ka} x {kb}: swizzled scales give another result"
    if sfa is not None:
        # A's scales as rows x K blocks where the swizzled layout is said: 200 rows are not
        # whole tiles, so the count shows it.
        with pytest.raises(ValueError):
            bs.gemm_nt(a, sfa, b, bs.swizzle_scales_128x4(sfb), got, scale_layout="128x4")


def sparse_blocks(rows, k, bs, gen, keep=0.4):
    """A (rows, k) fp32 matrix of random blocks of bs x bs, about `keep` of them nonzero (at
    least one)."""
    mask = torch.rand(rows // bs, k // bs, device="cuda", generator=gen) < keep
    mask[0, 0] = True
    x = torch.randn(rows, k, device="cuda", generator=gen)
    return x * mask.repeat_interleave(bs, 0).repeat_interleave(bs, 1)


def fp8_sparse_blocks(rows, k, blk, gen, keep):
    """`sparse_blocks` quantized to e4m3 blocks with one fp32 scale per stored block: its torch
    BSR tensor, the scales, the codes, and the parts tuple `bsr_mm` takes."""
    blocks = sparse_blocks(rows, k, blk, gen, keep).to_sparse_bsr((blk, blk))
    vals = blocks.values()
    scale = vals.abs().amax(dim=(1, 2)).clamp(min=1e-12) / E4M3_MAX
    codes = (vals / scale[:, None, None]).to(torch.float8_e4m3fn)
    return blocks, scale, codes, (blocks.crow_indices(), blocks.col_indices(), codes, (rows, k))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sparse_side", ["a", "b"])
def test_bsr_mm_of_16_bit_blocks_matches_torch(dtype, sparse_side):
    gen = torch.Generator(device="cuda").manual_seed(46)
    m, n, k, blk = 256, 384, 512, 64
    sp = sparse_blocks(m if sparse_side == "a" else n, k, blk, gen).to(dtype)
    de = torch.randn(n if sparse_side == "a" else m, k, device="cuda", generator=gen).to(dtype)
    s = sp.to_sparse_bsr((blk, blk))
    a, b = (s, de) if sparse_side == "a" else (de, s)
    fa, fb = (sp, de) if sparse_side == "a" else (de, sp)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.bsr_mm(a, b, out)
    torch.cuda.current_stream().synchronize()
    ref = fa.double() @ fb.double().t()
    mag = fa.double().abs() @ fb.double().abs().t()
    # 16-bit tensor cores add each 16-wide step's exact products to an fp32 sum with at most
    # two roundings of 2^-23 of Σ|a·b| (the Rust tests' bf16_mma_rel), then one fp32 rounding.
    tol = (k / 8 + 1) * 2.0**-23 * mag + 2.0**-24 * ref.abs() + 1e-30
    assert torch.isfinite(out).all()
    worst = ((out.double() - ref).abs() / tol).max().item()
    assert worst <= 1.0, f"{dtype} sparse {sparse_side}: error {worst:.3f} of the bound"


def test_bsr_mm_of_fp8_blocks_with_a_dense_fp8_a_matches_torch():
    gen = torch.Generator(device="cuda").manual_seed(47)
    m, n, k, blk = 200, 384, 512, 128
    x = torch.randn(m, k, device="cuda", generator=gen)
    a, sa = quantize_rows(x)
    blocks, scale, codes, sparse = fp8_sparse_blocks(n, k, blk, gen, keep=0.5)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.bsr_mm(a, sparse, out, sfa=sa, block_scales=scale)
    torch.cuda.current_stream().synchronize()
    fa = dequantized(a, sa, 1).double()
    fw = (codes.double() * scale.double()[:, None, None])
    dense_w = torch.sparse_bsr_tensor(blocks.crow_indices(), blocks.col_indices(), fw, size=(n, k)).to_dense()
    ref = fa @ dense_w.t()
    mag = fa.abs() @ dense_w.abs().t()
    tol = 2.0**-7 * mag + 2.0**-23 * ref.abs() + 1e-30
    assert torch.isfinite(out).all()
    worst = ((out.double() - ref).abs() / tol).max().item()
    assert worst <= 1.0, f"FP8 blocks: error {worst:.3f} of the bound"
    with pytest.raises(ValueError):
        bs.bsr_mm(a, sparse, out, sfa=sa)  # e4m3 blocks without their scales
    with pytest.raises(ValueError):
        bs.bsr_mm(a, a, out, sfa=sa)  # neither sparse


def test_a_prepared_sparse_operand_gives_the_per_call_result_on_any_stream():
    gen = torch.Generator(device="cuda").manual_seed(48)
    m, n, k, blk = 200, 384, 512, 128
    x = torch.randn(m, k, device="cuda", generator=gen)
    a, sa = quantize_rows(x)
    _, scale, codes, sparse = fp8_sparse_blocks(n, k, blk, gen, keep=0.5)
    want = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.bsr_mm(a, sparse, want, sfa=sa, block_scales=scale)
    w = bs.prepare_bsr(sparse, block_scales=scale)
    assert (w.shape, w.block, w.nnz) == ((n, k), blk, codes.shape[0])
    side = torch.cuda.Stream()
    for stream in [None, side]:
        got = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            bs.bsr_mm(a, w, got, sfa=sa)
        torch.cuda.synchronize()
        assert torch.equal(got, want), "a prepared operand gives another result"
    # 16-bit blocks as the sparse A, prepared.
    sp = sparse_blocks(256, k, 64, gen).to(torch.bfloat16)
    de = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
    ref = torch.full((256, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.bsr_mm(sp.to_sparse_bsr((64, 64)), de, ref)
    got = torch.full_like(ref, float("nan"))
    bs.bsr_mm(bs.prepare_bsr(sp.to_sparse_bsr((64, 64))), de, got)
    torch.cuda.synchronize()
    assert torch.equal(got, ref)
    with pytest.raises(ValueError):
        bs.bsr_mm(a, w, got, sfa=sa, block_scales=scale)  # the prepared operand holds them


def fp4_values(codes):
    """The e2m1 values of codes two a byte (the first in the low nibble)."""
    u8 = codes.view(torch.uint8)
    rows, half = u8.shape
    nib = torch.stack([u8 & 0xF, u8 >> 4], dim=2).view(rows, 2 * half).long()
    table = torch.tensor(E2M1, device="cuda", dtype=torch.float64)
    return table[nib & 7] * torch.where(nib >= 8, -1.0, 1.0).double()


@pytest.mark.parametrize("kind", ["mxfp4", "e2m1x16", "nvfp4"])
def test_the_fp4_quantizers_give_codes_and_scales_that_feed_gemm_nt(kind):
    gen = torch.Generator(device="cuda").manual_seed(43)
    m, n, k = 96, 256, 512
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 3
    w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    per = 32 if kind == "mxfp4" else 16
    if kind == "nvfp4":
        xq, xs, xg = bs.quantize_nvfp4(x)
        wq, ws, wg = bs.quantize_nvfp4(w, 0.01)
        assert wg == pytest.approx(0.01) and xg > 0
    else:
        (xq, xs), (wq, ws) = bs.quantize_mxfp4(x, per), bs.quantize_mxfp4(w, per)
        xg = wg = 1.0
    torch.cuda.current_stream().synchronize()
    assert xq.shape == (m, k // 2) and xq.dtype == torch.float4_e2m1fn_x2
    assert xs.shape == (m, k // per)
    sv = xs.double()
    assert torch.isfinite(sv).all() and (sv > 0).all()
    if kind != "nvfp4":
        assert torch.equal(torch.exp2(torch.log2(sv).round()), sv), "scales are powers of two"
    deq = fp4_values(xq) * sv.repeat_interleave(per, 1) * xg
    xb = x.double().view(m, k // per, per)
    amax = xb.abs().amax(dim=2, keepdim=True)
    # e2m1's top step (4 to 6) is a third of the block's largest value at most, and a
    # power-of-two or e4m3 scale leaves that value within 8 / 6 of the largest code: every
    # element within half the block's largest magnitude.
    assert ((deq.view(m, k // per, per) - xb).abs() <= amax / 2).all()
    # The codes and scales as they are feed the GEMM.
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.gemm_nt(xq, xs, wq, ws, out, a_global_scale=xg, b_global_scale=wg)
    torch.cuda.current_stream().synchronize()
    fw = fp4_values(wq) * ws.double().repeat_interleave(per, 1) * wg
    ref = deq @ fw.t()
    mag = deq.abs() @ fw.abs().t()
    got = out.double()
    assert torch.isfinite(got).all()
    worst = ((got - ref).abs() / (2.0**-7 * mag + 2.0**-23 * ref.abs() + 1e-30)).max().item()
    assert worst <= 1.0, f"{kind}: error {worst:.3f} of the bound"


@pytest.mark.parametrize("kind", ["fp8", "mxfp4"])
def test_the_fused_epilogue_matches_torch(kind):
    gen = torch.Generator(device="cuda").manual_seed(47)
    m, n, k = 100, 512, 1024
    a, sfa, fa = operand(kind, m, k, gen, False)
    b, sfb, fb = operand(kind, n, k, gen, True)
    alpha = 0.5
    bias = torch.randn(n, device="cuda", generator=gen)
    res = torch.randn(m, n // 2, device="cuda", generator=gen).to(torch.bfloat16)
    call = bs.fp8_gemm_nt if kind == "fp8" else bs.gemm_nt
    t = alpha * (fa @ fb.t()) + bias.double()
    err = alpha * 2.0**-7 * (fa.abs() @ fb.abs().t())  # FP8 sums' bound, before the epilogue
    # SiLU + bias (Lipschitz 1.1), then SwiGLU with a residual.
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
    call(a, sfa, b, sfb, out, alpha=alpha, bias=bias, activation="silu")
    torch.cuda.current_stream().synchronize()
    ref = t * torch.sigmoid(t)
    tol = 1.1 * err + 2.0**-20 * ref.abs() + 1e-6
    got = out.double()
    assert torch.isfinite(got).all()
    assert ((got - ref).abs() <= tol).all(), ((got - ref).abs() / tol).max()
    out2 = torch.full((m, n // 2), float("nan"), device="cuda", dtype=torch.float32)
    call(a, sfa, b, sfb, out2, alpha=alpha, bias=bias, activation="swiglu", residual=res)
    torch.cuda.current_stream().synchronize()
    g_, u_ = t[:, 0::2], t[:, 1::2]
    eg, eu = err[:, 0::2], err[:, 1::2]
    ref2 = g_ * torch.sigmoid(g_) * u_ + res.double()
    tol2 = 1.1 * u_.abs() * eg + (g_.abs() + eg) * eu + 2.0**-20 * ref2.abs() + 1e-6
    got2 = out2.double()
    assert torch.isfinite(got2).all()
    assert ((got2 - ref2).abs() <= tol2).all(), ((got2 - ref2).abs() / tol2).max()


@pytest.mark.parametrize("ka,kb", [("mxfp4", "mxfp4"), ("bf16", "mxfp4"), ("fp8", "mxfp4"), ("nvfp4", "nvfp4")])
def test_grouped_calls_of_any_format_match_torch_per_expert(ka, kb):
    gen = torch.Generator(device="cuda").manual_seed(53)
    g, n, k = 4, 256, 512
    sizes = [40, 0, 130, 70]
    r = sum(sizes) + 16  # rows past the last end stay unwritten
    a, sfa, fa = operand(ka, r, k, gen, False)
    experts = [operand(kb, n, k, gen, True) for _ in range(g)]
    b = torch.stack([e[0] for e in experts])
    sfb = torch.stack([e[1] for e in experts])
    ga, gb = (0.5, 2.0) if kb == "nvfp4" else (1.0, 1.0)
    ends = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
    out = torch.full((r, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.m_grouped_gemm_nt_contiguous(a, sfa, b, sfb, out, ends, a_global_scale=ga, b_global_scale=gb)
    torch.cuda.current_stream().synchronize()
    start = 0
    for e, size in enumerate(sizes):
        fb = experts[e][2]
        ref = (fa[start:start + size] @ fb.t()) * (ga * gb)
        mag = (fa[start:start + size].abs() @ fb.abs().t()) * (ga * gb)
        got = out[start:start + size].double()
        assert torch.isfinite(got).all()
        tol = 2.0**-7 * mag + 2.0**-23 * ref.abs() + 1e-30
        assert ((got - ref).abs() <= tol).all(), (e, ((got - ref).abs() / tol).max())
        start += size
    assert torch.isnan(out[start:]).all(), "rows past the last end are not written"
    # Masked: the same experts, each group's first rows of a capacity of 160.
    cap = 160
    am, sfam, fam = operand(ka, g * cap, k, gen, False)
    am = am.view(g, cap, *am.shape[1:])
    sfam = None if sfam is None else sfam.view(g, cap, *sfam.shape[1:])
    counts = torch.tensor(sizes, device="cuda", dtype=torch.int32)
    outm = torch.full((g, cap, n), float("nan"), device="cuda", dtype=torch.float32)
    bs.m_grouped_gemm_nt_masked(am, sfam, b, sfb, outm, counts, a_global_scale=ga, b_global_scale=gb)
    torch.cuda.current_stream().synchronize()
    for e, size in enumerate(sizes):
        fa_e = fam[e * cap:e * cap + size]
        ref = (fa_e @ experts[e][2].t()) * (ga * gb)
        mag = (fa_e.abs() @ experts[e][2].abs().t()) * (ga * gb)
        got = outm[e, :size].double()
        tol = 2.0**-7 * mag + 2.0**-23 * ref.abs() + 1e-30
        assert torch.isfinite(got).all() and ((got - ref).abs() <= tol).all(), e
        assert torch.isnan(outm[e, size:]).all(), "rows past a group's count are not written"
