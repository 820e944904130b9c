"""The package without a GPU: it imports, checks its arguments (dtype, shape, device, layout)
before any GPU work, and a well-formed call raises NoDeviceError. Tensors are stand-ins with
torch's interface (data_ptr, dtype, shape, stride, is_cuda, device), so torch is not needed."""

import pytest

import blockscaled as bs


class Dtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class Device:
    def __init__(self, index):
        self.index = index

    def __str__(self):
        return "cpu" if self.index is None else f"cuda:{self.index}"


class FakeTensor:
    """Just torch's tensor attributes the package reads."""

    def __init__(self, shape, dtype, strides=None, device=0, ptr=0x7F0000000000):
        self.shape = tuple(shape)
        self.dtype = Dtype(dtype)
        self._strides = strides
        self.is_cuda = device is not None
        self.device = Device(device)
        self._ptr = ptr

    def data_ptr(self):
        return self._ptr

    def stride(self):
        if self._strides is not None:
            return tuple(self._strides)
        s, acc = [], 1
        for d in reversed(self.shape):
            s.append(acc)
            acc *= d
        return tuple(reversed(s))


def operands(m=256, n=512, k=1024, out="bfloat16", a="float8_e4m3fn"):
    kb = k // 128
    return dict(
        a=FakeTensor((m, k), a),
        # DeepGEMM's M-major scales: (M, K/128) with strides (1, M).
        sfa=FakeTensor((m, kb), "float32", strides=(1, m)),
        b=FakeTensor((n, k), "float8_e4m3fn"),
        sfb=FakeTensor((n // 128, kb), "float32"),
        out=FakeTensor((m, n), out),
    )


def call(**kw):
    args = operands()
    args.update(kw)
    bs.fp8_gemm_nt(args["a"], args["sfa"], args["b"], args["sfb"], args["out"])


def test_imports_and_names_its_version():
    assert bs.__version__ == bs.version() and bs.version().count(".") == 2
    for e in [bs.ShapeError, bs.NoDeviceError, bs.AlignmentError, bs.WrongGpuError]:
        assert issubclass(e, bs.BlockscaledError)


# What a well-formed call with the stand-ins' pointers raises once it has passed every check:
# NoDeviceError without a GPU; where there is one, its driver does not know the pointers.
REACHES_THE_DEVICE = (bs.NoDeviceError, bs.WrongGpuError)


def test_a_well_formed_call_without_a_gpu_raises_no_device():
    with pytest.raises(REACHES_THE_DEVICE) as raised:
        call()
    if raised.type is bs.WrongGpuError:
        pytest.skip("a GPU is present (its driver rejects the stand-ins' pointers)")
    assert raised.match("no CUDA device|libcuda|GPU")


@pytest.mark.parametrize("out", ["bfloat16", "float16", "float32"])
def test_every_output_dtype_reaches_the_device(out):
    args = operands(out=out)
    with pytest.raises(REACHES_THE_DEVICE):
        bs.fp8_gemm_nt(*args.values())


def test_wrong_dtypes_are_type_errors():
    m, k = 256, 1024
    with pytest.raises(TypeError, match="a: dtype"):
        call(a=FakeTensor((m, k), "bfloat16"))
    with pytest.raises(TypeError, match="sfa: dtype"):
        call(sfa=FakeTensor((m, k // 128), "float16"))
    with pytest.raises(TypeError, match="out: dtype"):
        call(out=FakeTensor((m, 512), "float8_e4m3fn"))
    with pytest.raises(TypeError, match="int64 is not one"):
        call(b=FakeTensor((512, k), "int64"))


def test_shapes_that_do_not_multiply_are_value_errors():
    with pytest.raises(ValueError, match="does not give out"):
        call(out=FakeTensor((256, 384), "bfloat16"))
    with pytest.raises(ValueError, match="does not give out"):
        call(b=FakeTensor((512, 512), "float8_e4m3fn"))
    with pytest.raises(ValueError, match="2 or 3 dimensions"):
        call(a=FakeTensor((1024,), "float8_e4m3fn"))


def test_non_contiguous_operands_and_host_tensors_are_value_errors():
    with pytest.raises(ValueError, match="contiguous"):
        call(a=FakeTensor((256, 1024), "float8_e4m3fn", strides=(1, 256)))
    with pytest.raises(ValueError, match="CUDA tensor"):
        call(out=FakeTensor((256, 512), "bfloat16", device=None))
    with pytest.raises(ValueError, match="cuda:1"):
        call(b=FakeTensor((512, 1024), "float8_e4m3fn", device=1))


def test_scales_of_another_batch_count_are_value_errors():
    with pytest.raises(ValueError, match="batch entries"):
        call(sfb=FakeTensor((2, 4, 8), "float32"))


def test_objects_that_are_not_tensors_are_type_errors():
    with pytest.raises(TypeError, match="torch tensor or an object"):
        call(a=[1, 2, 3])


class Cai:
    def __init__(self, shape, typestr, strides=None):
        self.__cuda_array_interface__ = dict(
            shape=shape, typestr=typestr, data=(0x7F0000000000, False), strides=strides, version=3
        )


def test_cuda_array_interface_producers_are_read():
    m, n, k = 256, 512, 1024
    args = dict(
        a=Cai((m, k), "|u1"),
        sfa=Cai((m, k // 128), "<f4"),
        b=Cai((n, k), "|u1"),
        sfb=Cai((n // 128, k // 128), "<f4"),
        out=Cai((m, n), "<f2"),
    )
    with pytest.raises(REACHES_THE_DEVICE):
        bs.fp8_gemm_nt(*args.values())
    with pytest.raises(TypeError, match="<f8 is not one"):
        bs.fp8_gemm_nt(*{**args, "out": Cai((m, n), "<f8")}.values())
    with pytest.raises(ValueError, match="not whole elements"):
        bs.fp8_gemm_nt(*{**args, "sfa": Cai((m, k // 128), "<f4", strides=(4, 2))}.values())


def grouped(g=4, r=512, n=256, k=512, cap=128):
    """Stand-ins for a contiguous (R rows in all) and a masked (G × capacity) grouped call."""
    kb = k // 128
    experts = dict(
        b=FakeTensor((g, n, k), "float8_e4m3fn"),
        sfb=FakeTensor((g, n // 128, kb), "float32"),
    )
    contiguous = dict(
        a=FakeTensor((r, k), "float8_e4m3fn"),
        sfa=FakeTensor((r, kb), "float32", strides=(1, r)),
        **experts,
        out=FakeTensor((r, n), "bfloat16"),
        offs=FakeTensor((g,), "int32"),
    )
    masked = dict(
        a=FakeTensor((g, cap, k), "float8_e4m3fn"),
        sfa=FakeTensor((g, cap, kb), "float32"),
        **experts,
        out=FakeTensor((g, cap, n), "bfloat16"),
        masked_m=FakeTensor((g,), "int32"),
    )
    return contiguous, masked


def test_well_formed_grouped_calls_reach_the_device():
    contiguous, masked = grouped()
    with pytest.raises(REACHES_THE_DEVICE):
        bs.m_grouped_fp8_gemm_nt_contiguous(**contiguous)
    with pytest.raises(REACHES_THE_DEVICE):
        bs.m_grouped_fp8_gemm_nt_masked(**masked, expected_m=64)


def test_grouped_calls_check_their_groups_and_shapes_first():
    contiguous, masked = grouped()
    c = lambda **kw: bs.m_grouped_fp8_gemm_nt_contiguous(**{**contiguous, **kw})
    m = lambda **kw: bs.m_grouped_fp8_gemm_nt_masked(**{**masked, **kw})
    with pytest.raises(TypeError, match="offs: dtype"):
        c(offs=FakeTensor((4,), "float32"))
    with pytest.raises(ValueError, match="one end per expert"):
        c(offs=FakeTensor((5,), "int32"))
    with pytest.raises(ValueError, match="one end per expert"):
        c(out=FakeTensor((500, 256), "bfloat16"))
    with pytest.raises(ValueError, match=r"a \(R, K\)"):
        c(a=FakeTensor((1, 512, 512), "float8_e4m3fn"))
    with pytest.raises(ValueError, match="contiguous"):
        c(offs=FakeTensor((4,), "int32", strides=(2,)))
    with pytest.raises(ValueError, match="offs or m_indices"):
        bs.m_grouped_fp8_gemm_nt_contiguous(**{**contiguous, "offs": None})
    with pytest.raises(ValueError, match="offs or m_indices"):
        c(m_indices=FakeTensor((512,), "int32"))
    with pytest.raises(TypeError, match="masked_m: dtype"):
        m(masked_m=FakeTensor((4,), "int64"))
    with pytest.raises(ValueError, match="one count per expert"):
        m(out=FakeTensor((4, 64, 256), "bfloat16"))
    with pytest.raises(ValueError, match="one count per expert"):
        m(a=FakeTensor((3, 128, 512), "float8_e4m3fn"), sfa=FakeTensor((3, 128, 4), "float32"))
    with pytest.raises(ValueError, match=r"a \(G, C, K\)"):
        m(a=FakeTensor((128, 512), "float8_e4m3fn"))


def test_the_fp8_quantizer_checks_its_tensors_first():
    m, k = 64, 512
    x = FakeTensor((m, k), "bfloat16")
    out = FakeTensor((m, k), "float8_e4m3fn")
    scales = FakeTensor((m, k // 128), "float32")
    with pytest.raises(REACHES_THE_DEVICE):
        bs.per_token_group_quant_fp8(x, out=out, scales=scales)
    with pytest.raises(REACHES_THE_DEVICE):
        bs.per_token_group_quant_fp8_into(x, out, FakeTensor((m, k // 128), "float32", strides=(1, m)))
    with pytest.raises(ValueError, match="group_size 64"):
        bs.per_token_group_quant_fp8(x, 64, out=out, scales=scales)
    with pytest.raises(TypeError, match="x: dtype"):
        bs.per_token_group_quant_fp8_into(FakeTensor((m, k), "float8_e4m3fn"), out, scales)
    with pytest.raises(TypeError, match="out: dtype"):
        bs.per_token_group_quant_fp8_into(x, FakeTensor((m, k), "bfloat16"), scales)
    with pytest.raises(ValueError, match="not of x's shape"):
        bs.per_token_group_quant_fp8_into(x, FakeTensor((m, k + 128), "float8_e4m3fn"), scales)
    with pytest.raises(ValueError, match="multiple of the group size"):
        bs.per_token_group_quant_fp8_into(
            FakeTensor((m, 200), "float32"), FakeTensor((m, 200), "float8_e4m3fn"), scales
        )


def test_the_mxfp8_quantizer_checks_its_tensors_first():
    m, k = 64, 256
    x = FakeTensor((m, k), "float16")
    scales = FakeTensor((m, k // 32), "float8_e8m0fnu")
    for code in ["float8_e4m3fn", "float8_e5m2"]:
        with pytest.raises(REACHES_THE_DEVICE):
            bs.quantize_mxfp8_into(x, FakeTensor((m, k), code), scales)
    out = FakeTensor((m, k), "float8_e4m3fn")
    with pytest.raises(REACHES_THE_DEVICE):
        bs.quantize_mxfp8(x, out=out, scales=scales)
    with pytest.raises(ValueError, match="e4m3 or e5m2"):
        bs.quantize_mxfp8(x, "e2m1", out=out, scales=scales)
    with pytest.raises(TypeError, match="scales: dtype"):
        bs.quantize_mxfp8_into(x, out, FakeTensor((m, k // 32), "float32"))
    with pytest.raises(TypeError, match="out: dtype"):
        bs.quantize_mxfp8_into(x, FakeTensor((m, k), "bfloat16"), scales)
    with pytest.raises(ValueError, match="multiple of the group size 32"):
        bs.quantize_mxfp8_into(
            FakeTensor((m, 48), "float32"), FakeTensor((m, 48), "float8_e4m3fn"), scales
        )


def test_block_scaled_formats_are_read_from_the_dtypes_and_reach_the_device():
    m, n, k = 100, 256, 512
    fp4 = lambda rows: FakeTensor((rows, k // 2), "float4_e2m1fn_x2")
    e8m0 = lambda rows, per: FakeTensor((rows, k // per), "float8_e8m0fnu")
    out = FakeTensor((m, n), "bfloat16")
    pairs = [
        # MXFP4, e2m1 with e8m0 per 16, NVFP4 (e4m3 scales per 16 and a global scale).
        (fp4(m), e8m0(m, 32), fp4(n), e8m0(n, 32)),
        (fp4(m), e8m0(m, 16), fp4(n), e8m0(n, 16)),
        (fp4(m), FakeTensor((m, k // 16), "float8_e4m3fn"), fp4(n), FakeTensor((n, k // 16), "float8_e4m3fn")),
        # MXFP8; W4A16 (bf16 activations, no scales); W4A8 (DeepSeek activations).
        (FakeTensor((m, k), "float8_e4m3fn"), e8m0(m, 32), FakeTensor((n, k), "float8_e5m2"), e8m0(n, 32)),
        (FakeTensor((m, k), "bfloat16"), None, fp4(n), e8m0(n, 32)),
        (FakeTensor((m, k), "float8_e4m3fn"), FakeTensor((m, k // 128), "float32"), fp4(n), e8m0(n, 32)),
    ]
    for a, sfa, b, sfb in pairs:
        with pytest.raises(REACHES_THE_DEVICE):
            bs.gemm_nt(a, sfa, b, sfb, out, a_global_scale=0.5, b_global_scale=2.0)


def test_block_scaled_calls_that_cannot_be_are_clear_errors():
    m, n, k = 100, 256, 512
    fp4 = lambda rows: FakeTensor((rows, k // 2), "float4_e2m1fn_x2")
    e8m0 = lambda rows, per: FakeTensor((rows, k // per), "float8_e8m0fnu")
    out = FakeTensor((m, n), "bfloat16")
    # e2m1 codes with fp32 scales, or scales per 64: no such format.
    with pytest.raises(TypeError, match="want FP8 with e8m0"):
        bs.gemm_nt(fp4(m), FakeTensor((m, k // 32), "float32"), fp4(n), e8m0(n, 32), out)
    with pytest.raises(TypeError, match="one per 64"):
        bs.gemm_nt(fp4(m), e8m0(m, 64), fp4(n), e8m0(n, 32), out)
    # 16-bit values are activations, and block-scaled codes need scales.
    with pytest.raises(TypeError, match="taken as A"):
        bs.gemm_nt(fp4(m), e8m0(m, 32), FakeTensor((n, k), "bfloat16"), e8m0(n, 32), out)
    with pytest.raises(ValueError, match="need their scales"):
        bs.gemm_nt(fp4(m), None, fp4(n), e8m0(n, 32), out)
    # K of A (two codes a byte) against B's.
    with pytest.raises(ValueError, match="does not give out"):
        bs.gemm_nt(FakeTensor((m, k), "float8_e4m3fn"), e8m0(m, 32), FakeTensor((n, k), "float4_e2m1fn_x2"), FakeTensor((n, 2 * k // 32), "float8_e8m0fnu"), out)


def test_the_fp4_quantizer_checks_its_tensors_before_the_device():
    x = FakeTensor((64, 256), "bfloat16")
    codes = FakeTensor((64, 128), "float4_e2m1fn_x2")
    for scales in [FakeTensor((64, 8), "float8_e8m0fnu"), FakeTensor((64, 16), "float8_e4m3fn")]:
        with pytest.raises(REACHES_THE_DEVICE):
            bs.quantize_fp4_into(x, codes, scales)
    with pytest.raises(ValueError, match="K halved"):
        bs.quantize_fp4_into(x, FakeTensor((64, 256), "float4_e2m1fn_x2"), FakeTensor((64, 8), "float8_e8m0fnu"))
    with pytest.raises(ValueError, match="one per 32 or 16"):
        bs.quantize_fp4_into(x, codes, FakeTensor((64, 8), "float8_e4m3fn"))
    with pytest.raises(ValueError, match="NVFP4's"):
        bs.quantize_fp4_into(x, codes, FakeTensor((64, 8), "float8_e8m0fnu"), global_scale=2.0)


def test_the_fused_epilogue_is_checked_before_the_device():
    args = operands()
    bias = FakeTensor((512,), "float32")
    res = FakeTensor((256, 512), "bfloat16")
    with pytest.raises(REACHES_THE_DEVICE):
        bs.fp8_gemm_nt(*args.values(), alpha=0.5, bias=bias, activation="silu", residual=res)
    with pytest.raises(ValueError, match='activation "tanh"'):
        bs.fp8_gemm_nt(*args.values(), activation="tanh")
    # SwiGLU halves the output's columns.
    with pytest.raises(ValueError, match="swiglu: N / 2"):
        bs.fp8_gemm_nt(*args.values(), activation="swiglu")
    with pytest.raises(REACHES_THE_DEVICE):
        a = dict(args, out=FakeTensor((256, 256), "bfloat16"))
        bs.fp8_gemm_nt(*a.values(), activation="swiglu")
    with pytest.raises(TypeError, match="bias: dtype"):
        bs.fp8_gemm_nt(*args.values(), bias=FakeTensor((512,), "int32"))


def test_grouped_calls_of_any_format_are_checked_before_the_device():
    g, r, n, k, cap = 4, 300, 256, 512, 64
    fp4 = lambda *shape: FakeTensor(shape, "float4_e2m1fn_x2")
    e8m0 = lambda *shape: FakeTensor(shape, "float8_e8m0fnu")
    offs = FakeTensor((g,), "int32")
    # MXFP4 activations and experts; bf16 activations with MXFP4 experts (W4A16).
    with pytest.raises(REACHES_THE_DEVICE):
        bs.m_grouped_gemm_nt_contiguous(fp4(r, k // 2), e8m0(r, k // 32), fp4(g, n, k // 2), e8m0(g, n, k // 32), FakeTensor((r, n), "bfloat16"), offs)
    with pytest.raises(REACHES_THE_DEVICE):
        bs.m_grouped_gemm_nt_masked(FakeTensor((g, cap, k), "bfloat16"), None, fp4(g, n, k // 2), e8m0(g, n, k // 32), FakeTensor((g, cap, n), "bfloat16"), offs)
    # One end per expert; A's K against B's.
    with pytest.raises(ValueError, match="one end per expert"):
        bs.m_grouped_gemm_nt_contiguous(fp4(r, k // 2), e8m0(r, k // 32), fp4(g, n, k // 2), e8m0(g, n, k // 32), FakeTensor((r, n), "bfloat16"), FakeTensor((g + 1,), "int32"))
    with pytest.raises(ValueError, match="does not give out"):
        bs.m_grouped_gemm_nt_masked(fp4(g, cap, k // 2), e8m0(g, cap, k // 32), fp4(g, n, k), e8m0(g, n, k // 16), FakeTensor((g, cap, n), "bfloat16"), offs)


def bsr_parts(elem="bf16", rows=128, k=256, block=64):
    """Host parts of a block-sparse operand as `_bsr_mm` / `_bsr_prepare` take them: two stored
    blocks, one in each block row."""
    size = 1 if elem == "e4m3" else 2
    values = bytes(range(256)) * (2 * block * block * size // 256)
    scales = [0.5, 2.0] if elem == "e4m3" else []
    return (elem, (rows, k, block), [0, 1, 2], [0, 3], values, scales)


def test_sparse_operands_are_checked_before_the_device():
    from blockscaled import _native

    for bad, err in [
        (bsr_parts(elem="fp32"), TypeError),
        (bsr_parts()[:4] + (b"\0" * 10, []), bs.BlockscaledError),  # too few bytes
        (bsr_parts()[:2] + ([0, 2, 1], [0, 3]) + bsr_parts()[4:], bs.BlockscaledError),
    ]:
        with pytest.raises(err):
            _native._bsr_prepare(bad, 0)
        with pytest.raises(err):
            _native._bsr_mm("a", bad, FakeTensor((64, 256), "bfloat16"), None, FakeTensor((128, 64), "float32"))
    good = bsr_parts()
    with pytest.raises(ValueError):
        _native._bsr_mm("c", good, FakeTensor((64, 256), "bfloat16"), None, FakeTensor((128, 64), "float32"))
    # K of the dense operand, and out's shape, must match the sparse one's.
    with pytest.raises(ValueError):
        _native._bsr_mm("a", good, FakeTensor((64, 512), "bfloat16"), None, FakeTensor((128, 64), "float32"))
    with pytest.raises(ValueError):
        _native._bsr_mm("b", good, FakeTensor((64, 256), "bfloat16"), None, FakeTensor((128, 64), "float32"))


def test_well_formed_sparse_calls_reach_the_device():
    from blockscaled import _native

    dense, out = FakeTensor((64, 256), "bfloat16"), FakeTensor((128, 64), "float32")
    with pytest.raises(REACHES_THE_DEVICE):
        _native._bsr_mm("a", bsr_parts(), dense, None, out)
    try:
        p = _native._bsr_prepare(bsr_parts(), 0)
    except bs.NoDeviceError:
        return
    # A GPU is present: the operand was uploaded for real.
    assert (p.shape, p.block, p.nnz, p.device) == ((128, 256), 64, 2, 0)
