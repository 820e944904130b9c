"""blockscaled: block-scaled (DeepSeek FP8, MXFP8, MXFP4, NVFP4) GEMM on NVIDIA Hopper GPUs.

Tensors are used where they are, without copies: torch tensors (read through their own
methods; torch itself is not a dependency) or any object with ``__cuda_array_interface__``. A
call is enqueued on torch's current stream of the tensors' device (or the interface's
``stream``, or the ``stream=`` argument) and does not wait for it. Errors raise the exception
of their kind, all subclasses of ``BlockscaledError``; arguments that are not tensors of the
right dtype, shape, device or layout raise ``TypeError`` or ``ValueError`` before any GPU work.

Without a CUDA driver or GPU the package imports, and every call raises ``NoDeviceError``.
"""

from ._native import (
    AlignmentError,
    ArchitectureError,
    BlockscaledError,
    ConfigError,
    DriverError,
    FormatError,
    NoDeviceError,
    ShapeError,
    WrongGpuError,
    fp8_gemm_nt,
    m_grouped_fp8_gemm_nt_masked,
    m_grouped_gemm_nt_masked,
    per_token_group_quant_fp8_into,
    quantize_fp4_into,
    quantize_mxfp8_into,
    version,
)
from ._native import PreparedBsr, _bsr_mm, _bsr_prepare
from ._native import gemm_nt as _gemm_nt
from ._native import m_grouped_fp8_gemm_nt_contiguous as _contiguous
from ._native import m_grouped_gemm_nt_contiguous

__version__ = version()


def m_grouped_fp8_gemm_nt_contiguous(a, sfa, b, sfb, out, offs=None, *, m_indices=None, stream=None):
    """Grouped ``out = a · bᵀ`` over groups of consecutive rows (DeepGEMM's
    ``m_grouped_fp8_gemm_nt_contiguous``): ``a`` (R, K) FP8 with ``sfa`` (R, K/128) fp32, ``b``
    (G, N, K) FP8 with ``sfb`` (G, N/128, K/128) fp32, ``out`` (R, N).

    The groups as torch ``_grouped_mm``'s ``offs``: (G,) int32 on the GPU, group g is rows
    ``offs[g-1]:offs[g]``; they stay on the GPU (no synchronization). Or as DeepGEMM's
    ``m_indices``: (R,) int32, each row's group or -1 for padding, the groups in order; they are
    turned into ``offs`` with torch and checked on the host first (one synchronization). Padding
    rows inside the groups' span are computed with the next group's expert (their output is
    unspecified, as in DeepGEMM); rows past the last group are not written.
    """
    if (offs is None) == (m_indices is None):
        raise ValueError("the groups are needed as offs or m_indices (one of them)")
    if m_indices is not None:
        offs = offs_of_m_indices(m_indices, b.shape[0])
    _contiguous(a, sfa, b, sfb, out, offs, stream=stream)


def per_token_group_quant_fp8(x, group_size=128, *, column_major_scales=False, out=None, scales=None, stream=None):
    """DeepSeek-style FP8 activations (SGLang / vLLM's ``per_token_group_quant_fp8``): ``x`` (M, K)
    or (L, M, K) bf16, fp16 or fp32 to e4m3 codes of its shape and fp32 scales (M, K/128), one per
    row and 128 columns; ``column_major_scales`` gives them DeepGEMM's M-major strides. Returns
    ``(codes, scales)``; ``out`` / ``scales`` may be given (allocated with torch otherwise)."""
    if group_size != 128:
        raise ValueError(f"group_size {group_size}: the FP8 kernels take groups of 128")
    if out is None or scales is None:
        import torch
    if out is None:
        out = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    if scales is None:
        *lead, m, k = x.shape
        shape = (*lead, k // 128, m) if column_major_scales else (*lead, m, k // 128)
        scales = torch.empty(shape, device=x.device, dtype=torch.float32)
        if column_major_scales:
            scales = scales.transpose(-1, -2)
    per_token_group_quant_fp8_into(x, out, scales, stream=stream)
    return out, scales


def quantize_mxfp8(x, fp8="e4m3", *, out=None, scales=None, stream=None):
    """MXFP8 (OCP MX): ``x`` (M, K) or (L, M, K) bf16, fp16 or fp32 to ``fp8`` ("e4m3" or "e5m2")
    codes of its shape and one power-of-two scale per row and 32 columns, (M, K/32)
    ``float8_e8m0fnu``, K-major. Returns ``(codes, scales)``; ``out`` / ``scales`` may be given
    (allocated with torch otherwise)."""
    if fp8 not in ("e4m3", "e5m2"):
        raise ValueError(f"fp8 {fp8!r}: e4m3 or e5m2")
    if out is None or scales is None:
        import torch
    if out is None:
        code = torch.float8_e4m3fn if fp8 == "e4m3" else torch.float8_e5m2
        out = torch.empty(x.shape, device=x.device, dtype=code)
    if scales is None:
        *lead, m, k = x.shape
        scales = torch.empty((*lead, m, k // 32), device=x.device, dtype=torch.float8_e8m0fnu)
    quantize_mxfp8_into(x, out, scales, stream=stream)
    return out, scales


def _fp4_tensors(x, out, scales, per, scale_dtype):
    """``out`` and ``scales`` of a 4-bit quantizer, allocated with torch where not given: codes
    (…, M, K/2) two a byte, scales (…, M, K/per) K-major."""
    if out is None or scales is None:
        import torch
    *lead, m, k = x.shape
    if out is None:
        out = torch.empty((*lead, m, k // 2), device=x.device, dtype=torch.float4_e2m1fn_x2)
    if scales is None:
        scales = torch.empty((*lead, m, k // per), device=x.device, dtype=getattr(torch, scale_dtype))
    return out, scales


def quantize_mxfp4(x, block=32, *, out=None, scales=None, stream=None):
    """MXFP4 (OCP MX; ``block=16``: e2m1 with e8m0 scales per 16): ``x`` (M, K) or (L, M, K)
    bf16, fp16 or fp32 to e2m1 codes, two a byte (the first in the low nibble), (M, K/2)
    ``float4_e2m1fn_x2``, and one power-of-two scale per row and ``block`` columns, (M,
    K/block) ``float8_e8m0fnu``, K-major. Returns ``(codes, scales)``; ``out`` / ``scales`` may
    be given (allocated with torch otherwise)."""
    if block not in (32, 16):
        raise ValueError(f"block {block}: 32 (MXFP4) or 16")
    out, scales = _fp4_tensors(x, out, scales, block, "float8_e8m0fnu")
    quantize_fp4_into(x, out, scales, stream=stream)
    return out, scales


def quantize_nvfp4(x, global_scale=None, *, out=None, scales=None, stream=None):
    """NVFP4: ``x`` (M, K) or (L, M, K) bf16, fp16 or fp32 to e2m1 codes, two a byte, (M, K/2)
    ``float4_e2m1fn_x2``, an e4m3 scale per row and 16 columns, (M, K/16) ``float8_e4m3fn``,
    and one fp32 global scale: ``global_scale`` where given, else computed from the tensor's
    largest magnitude (one value read back: the call waits for the stream). Returns ``(codes,
    scales, global_scale)``, the global scale to pass to ``gemm_nt``."""
    out, scales = _fp4_tensors(x, out, scales, 16, "float8_e4m3fn")
    g = quantize_fp4_into(x, out, scales, global_scale=global_scale, stream=stream)
    return out, scales, g


def _swizzle_shape(rows, k_blocks, batch):
    return (1 if batch is None else batch), -(-rows // 128), -(-k_blocks // 4)


def unswizzle_scales_128x4(scales, rows, k_blocks, batch=None):
    """The ``(rows, k_blocks)`` scale grid (``(batch, rows, k_blocks)`` where ``batch`` is given)
    of one-byte scales in the 128×4 swizzled layout of cuBLAS's block-scaled GEMMs and torch's
    ``_scaled_mm`` (torchao's ``to_blocked``): each batch entry padded to whole tiles of 128
    rows × 4 K blocks, tiles row-major, each tile's scale ``(r, c)`` at ``(r % 32)·16 + (r //
    32)·4 + c``. ``scales`` holds exactly those tiles in any shape (flat, or padded 2-D / 3-D).
    One torch copy; the result is a strided view of it, which ``gemm_nt`` takes as it is."""
    import torch

    l, rt, ct = _swizzle_shape(rows, k_blocks, batch)
    if scales.numel() != l * rt * ct * 512:
        raise ValueError(
            f"scales: {scales.numel()} values, the 128x4 swizzled layout of {l} x {rows} x {k_blocks} "
            f"scales holds {l * rt * ct * 512} (whole tiles of 128 rows x 4 K blocks)"
        )
    u8 = scales.contiguous().view(torch.uint8).reshape(l, rt, ct, 32, 4, 4)
    grid = u8.permute(0, 1, 4, 3, 2, 5).reshape(l, rt * 128, ct * 4).view(scales.dtype)
    grid = grid[:, :rows, :k_blocks]
    return grid[0] if batch is None else grid


def swizzle_scales_128x4(scales):
    """``scales`` (rows, K blocks) or (batch, rows, K blocks), one byte each, in the 128×4
    swizzled layout (``unswizzle_scales_128x4``'s inverse): a flat tensor of whole tiles,
    zero-padded, as torch's ``_scaled_mm`` takes MX and NVFP4 scales."""
    import torch

    grid = scales if scales.dim() == 3 else scales.unsqueeze(0)
    l, rows, kb = grid.shape
    _, rt, ct = _swizzle_shape(rows, kb, l)
    padded = torch.zeros((l, rt * 128, ct * 4), device=scales.device, dtype=torch.uint8)
    padded[:, :rows, :kb] = grid.view(torch.uint8)
    tiles = padded.reshape(l, rt, 4, 32, ct, 4).permute(0, 1, 4, 3, 2, 5)
    return tiles.reshape(-1).view(scales.dtype)


def _scale_block(scales, block):
    """The K extent of one scale: ``block`` where given, else e4m3 scales' 16 (NVFP4) and
    e8m0's 32 (MX)."""
    if block is not None:
        return block
    return 16 if "e4m3" in str(scales.dtype) else 32


def gemm_nt(
    a,
    sfa,
    b,
    sfb,
    out,
    *,
    a_global_scale=1.0,
    b_global_scale=1.0,
    scale_layout=None,
    scale_block=None,
    stream=None,
    **epilogue,
):
    """``out = a · bᵀ`` for any pair of block-scaled operands the crate takes, the format read
    from the tensors' dtypes (see the native ``gemm_nt``'s documentation and docs/PYTHON.md):
    FP8 with e8m0 scales per 32 (MXFP8) or DeepSeek's fp32 ones; e2m1 (``float4_e2m1fn_x2``)
    with e8m0 scales per 32 (MXFP4) or 16, or e4m3 scales per 16 and a global scale (NVFP4);
    A may be bf16 / fp16 with ``sfa=None``. Scales are (rows, K / block) with any strides, or,
    with ``scale_layout="128x4"``, one-byte scales in the swizzled layout torch's
    ``_scaled_mm`` takes (``unswizzle_scales_128x4``: one torch copy each; ``scale_block``
    overrides the K extent their dtype implies, 32 for e8m0 and 16 for e4m3). The fused epilogue
    as ``fp8_gemm_nt``'s keywords."""
    if scale_layout not in (None, "rows", "128x4"):
        raise ValueError(f"scale_layout {scale_layout!r}: None (rows x K blocks) or '128x4'")
    if scale_layout == "128x4":
        sfa = _unswizzled(a, sfa, scale_block)
        sfb = _unswizzled(b, sfb, scale_block)
    _gemm_nt(
        a,
        sfa,
        b,
        sfb,
        out,
        a_global_scale=a_global_scale,
        b_global_scale=b_global_scale,
        stream=stream,
        **epilogue,
    )


def _unswizzled(t, scales, block):
    """The scale grid of operand ``t`` whose ``scales`` are in the 128×4 swizzled layout."""
    if scales is None:
        return None
    k = t.shape[-1] * (2 if "float4" in str(t.dtype) else 1)
    per = _scale_block(scales, block)
    if k % per:
        raise ValueError(f"K = {k} is not a multiple of the scale block {per}")
    batch = t.shape[0] if t.dim() == 3 else None
    return unswizzle_scales_128x4(scales, t.shape[-2], k // per, batch)


def _bsr_parts(x, block_scales, what):
    """The host parts `_bsr_mm` and `_bsr_prepare` take of a sparse operand: a torch
    ``sparse_bsr`` tensor or a tuple ``(crow_indices, col_indices, values, (rows, K))``, with
    ``block_scales`` for e4m3 blocks."""
    import torch

    if isinstance(x, tuple) and len(x) == 4:
        crow_t, col_t, vals, (rows, cols) = x
    elif getattr(x, "layout", None) == torch.sparse_bsr:
        crow_t, col_t, vals, (rows, cols) = x.crow_indices(), x.col_indices(), x.values(), tuple(x.shape)
    else:
        raise ValueError(f"{what}: a torch.sparse_bsr tensor or (crow_indices, col_indices, values, (rows, K))")
    if vals.dim() != 3 or vals.shape[1] != vals.shape[2]:
        raise ValueError(f"{what}: square blocks are needed, not values of shape {tuple(vals.shape)}")
    elem = {torch.float8_e4m3fn: "e4m3", torch.bfloat16: "bf16", torch.float16: "f16"}.get(vals.dtype)
    if elem is None:
        raise TypeError(f"{what}: sparse blocks of {vals.dtype}: float8_e4m3fn, bfloat16 or float16")
    if (elem == "e4m3") != (block_scales is not None):
        raise ValueError(f"{what}: e4m3 blocks need block_scales (one fp32 per block); 16-bit blocks take none")
    if block_scales is not None and block_scales.numel() != vals.shape[0]:
        raise ValueError(f"{what}: {block_scales.numel()} block scales for {vals.shape[0]} stored blocks")
    crow = crow_t.cpu().tolist()
    col = col_t.cpu().tolist()
    values = vals.contiguous().view(torch.uint8).cpu().numpy().tobytes()
    scales = [] if block_scales is None else block_scales.float().cpu().tolist()
    device = vals.device.index if vals.is_cuda else None
    return (elem, (rows, cols, vals.shape[1]), crow, col, values, scales), device


def prepare_bsr(sparse, *, block_scales=None, device=None, stream=None):
    """A block-sparse operand uploaded to the GPU once, for ``bsr_mm`` to take as it is in every
    later call on that GPU (on any stream): the sparse weights of a model, prepared at load.
    ``sparse`` as ``bsr_mm`` takes it (a torch ``sparse_bsr`` tensor or its parts), with
    ``block_scales`` for e4m3 blocks; ``device`` the CUDA ordinal (default: the blocks' device,
    else 0). Its structure, blocks and scales are read to the host here, once."""
    parts, on = _bsr_parts(sparse, block_scales, "prepare_bsr")
    device = on if device is None else device
    return _bsr_prepare(parts, 0 if device is None else device, stream=stream)


def bsr_mm(a, b, out, *, sfa=None, sfb=None, block_scales=None, stream=None):
    """``out = a · bᵀ`` with one of ``a``, ``b`` block-sparse (rows × K) on the tensor cores
    (``docs/SPARSE.md``): a ``prepare_bsr`` result (uploaded once, taken as it is), a torch
    ``sparse_bsr`` tensor, or its parts as a tuple ``(crow_indices, col_indices, values, (rows,
    K))`` (torch has no FP8 sparse tensors); its blocks e4m3 with ``block_scales`` (nnz,) fp32,
    one per stored block (blocks of 128), or bf16 / fp16 (blocks of 64 or 128, no scales). The
    other operand dense, (rows, K): FP8 with its scales as ``fp8_gemm_nt`` takes them (``sfa``
    for a dense A per 1×128, ``sfb`` for a dense B per 128×128), or bf16 / fp16 of the blocks'
    type without. ``out`` (M, N) bf16, fp16 or fp32.

    A sparse tensor or tuple is read to the host and uploaded for the call (the stream is
    synchronized once); a ``prepare_bsr`` result, the dense operand and ``out`` are used where
    they are, on torch's current stream."""
    import torch

    def sparse(x):
        return (
            isinstance(x, PreparedBsr)
            or (isinstance(x, tuple) and len(x) == 4)
            or getattr(x, "layout", None) == torch.sparse_bsr
        )

    if sparse(a) == sparse(b):
        raise ValueError("bsr_mm: exactly one of a, b is sparse (prepare_bsr's, a torch.sparse_bsr tensor or a tuple)")
    sparse_a = sparse(a)
    s, d, ds = (a, b, sfb) if sparse_a else (b, a, sfa)
    if isinstance(s, PreparedBsr):
        if block_scales is not None:
            raise ValueError("bsr_mm: a prepared operand holds its block scales (give them to prepare_bsr)")
        parts = s
    else:
        parts, _ = _bsr_parts(s, block_scales, "bsr_mm")
    _bsr_mm("a" if sparse_a else "b", parts, d, ds, out, stream=stream)


def offs_of_m_indices(m_indices, groups):
    """torch-style ``offs`` (each group's end row, (G,) int32) of DeepGEMM's ``m_indices`` (each
    row's group in ``0..groups``, or -1 for padding; groups in order). Checks the indices on the
    host (one synchronization): a group out of range or out of order is a ``ValueError``."""
    import torch

    if m_indices.dtype != torch.int32 or m_indices.dim() != 1:
        raise TypeError(f"m_indices: a 1-D int32 tensor is needed, not {m_indices.dtype} {tuple(m_indices.shape)}")
    if bool(((m_indices < -1) | (m_indices >= groups)).any()):
        raise ValueError(f"m_indices: a value outside -1..{groups - 1} (-1: padding; {groups} experts)")
    real = m_indices[m_indices >= 0]
    if real.numel() > 1 and not bool((real[1:] >= real[:-1]).all()):
        raise ValueError("m_indices: the groups' rows must come in group order")
    rows = torch.arange(1, m_indices.numel() + 1, device=m_indices.device, dtype=torch.int64)
    where = torch.where(m_indices >= 0, m_indices.long(), torch.full_like(m_indices, groups, dtype=torch.int64))
    last = torch.zeros(groups + 1, device=m_indices.device, dtype=torch.int64)
    last.scatter_reduce_(0, where, rows, reduce="amax")
    return torch.cummax(last[:groups], 0).values.to(torch.int32)

__all__ = [
    "AlignmentError",
    "ArchitectureError",
    "BlockscaledError",
    "ConfigError",
    "DriverError",
    "FormatError",
    "NoDeviceError",
    "ShapeError",
    "WrongGpuError",
    "PreparedBsr",
    "bsr_mm",
    "prepare_bsr",
    "fp8_gemm_nt",
    "gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_gemm_nt_contiguous",
    "m_grouped_gemm_nt_masked",
    "offs_of_m_indices",
    "per_token_group_quant_fp8",
    "swizzle_scales_128x4",
    "unswizzle_scales_128x4",
    "per_token_group_quant_fp8_into",
    "quantize_fp4_into",
    "quantize_mxfp4",
    "quantize_mxfp8",
    "quantize_mxfp8_into",
    "quantize_nvfp4",
    "version",
]
