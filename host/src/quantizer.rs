//! The device quantizers, host side: a bf16, fp16 or fp32 tensor on the GPU ([`DeviceTensor`])
//! to a [`DeviceMatrix`] of any FP8 or FP4 input format of the GEMMs, with the kernels of
//! `blockscaled_kernels::quantize`. Bit-identical to [`ScaledMatrix::quantize`](crate::ScaledMatrix::quantize) on the same
//! values (one source of the per-block rules: `blockscaled_kernels::format::quantize`).
//!
//! What runs: one launch per call, plus a maximum pass first when a scale spans more than one
//! 1×k block (per tensor; per row only where a row's lanes do not fit one block of the per-row
//! kernel) or NVFP4's tensor scale is computed; a computed NVFP4 tensor
//! scale is read back (4 bytes, a wait on the stream), since the matrix's description holds it:
//! pass [`QuantizeOptions::tensor_scale`] to keep the stream asynchronous.
//!
//! Non-finite input gives NaN scales (see the kernels' documentation), not an error: the kernels
//! cannot report one without a wait.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtrMut};

use crate::buffers::{GpuId, Mem};
use crate::error::{Error, Result, shape};
use crate::format::{OperandFormat, ScaleBlock, ScaleMajor, ScaleType};
use crate::launch::Launch;
use crate::matrix::{MatrixDesc, ScaleLayout};
use blockscaled_kernels::format::swizzle::swizzled_128x4_len;
use blockscaled_kernels::quantize::{
    self as kq, AMAX_KERNEL, InputType, QUANTIZE_THREADS, QuantizeKernel, QuantizeParams, ScaleSpan,
};

/// A bf16, fp16 or fp32 tensor `[batch][rows][k]` (row-major) on the GPU: a quantizer's input,
/// or a fused epilogue's bias, residual or β·C. In a buffer this crate allocated
/// ([`Gpu::upload_tensor`](crate::Gpu::upload_tensor), `DeviceTensor<'static>`) or over the
/// caller's memory for `'a` ([`Gpu::tensor_view`](crate::Gpu::tensor_view),
/// [`Gpu::tensor_from_raw`](crate::Gpu::tensor_from_raw)).
pub struct DeviceTensor<'a> {
    pub(crate) gpu: GpuId,
    pub(crate) input: InputType,
    pub(crate) rows: usize,
    pub(crate) k: usize,
    pub(crate) batch: usize,
    pub(crate) buf: Mem<'a>,
}

impl std::fmt::Debug for DeviceTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims = (self.rows, self.k, self.batch);
        crate::buffers::debug_buffer(f, "DeviceTensor", ("input", &self.input), dims, &self.buf)
    }
}

impl DeviceTensor<'_> {
    /// (rows, k, batch).
    pub fn dims(&self) -> (usize, usize, usize) {
        (self.rows, self.k, self.batch)
    }

    /// The element type.
    pub fn input_type(&self) -> InputType {
        self.input
    }
}

/// An element type a [`DeviceTensor`] holds: f32, `half::bf16`, `half::f16`.
pub trait TensorElement: Copy + sealed::Sealed {
    /// The quantizers' name for the type.
    const INPUT: InputType;
    /// The value's little-endian bytes.
    fn le_bytes(self) -> impl Iterator<Item = u8>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

impl TensorElement for f32 {
    const INPUT: InputType = InputType::F32;
    fn le_bytes(self) -> impl Iterator<Item = u8> {
        self.to_le_bytes().into_iter()
    }
}

impl TensorElement for half::bf16 {
    const INPUT: InputType = InputType::Bf16;
    fn le_bytes(self) -> impl Iterator<Item = u8> {
        self.to_bits().to_le_bytes().into_iter()
    }
}

impl TensorElement for half::f16 {
    const INPUT: InputType = InputType::F16;
    fn le_bytes(self) -> impl Iterator<Item = u8> {
        self.to_bits().to_le_bytes().into_iter()
    }
}

/// How [`Gpu::quantize_with`](crate::Gpu::quantize_with) writes its scales.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QuantizeOptions {
    /// The scale tensor's major order; `None`: what the format's users pass by default
    /// ([`ScaleMajor::default_for`]: M-major for DeepSeek activations, K-major for MX / NVFP4).
    pub major: Option<ScaleMajor>,
    /// NVFP4's fp32 tensor scale, when known (finite, > 0); `None`: computed from the tensor's
    /// largest magnitude, as the host quantizer does (one 4-byte read-back).
    pub tensor_scale: Option<f32>,
    /// Also write the one-byte scales in the 128×4 swizzled layout (cuBLAS, CUTLASS, torch
    /// `to_blocked`), zero-padded to whole tiles.
    pub swizzled_scales: bool,
}

/// A device quantizer's result: the matrix, and its scales in the 128×4 swizzled layout when
/// asked for (`batch` entries of whole tiles).
pub struct DeviceQuantized {
    /// The quantized matrix, prepared for the GEMM kernels.
    pub matrix: crate::DeviceMatrix<'static>,
    /// The scales in the 128×4 swizzled layout, when asked for.
    pub swizzled_scales: Option<CudaSlice<u8>>,
}

/// The loaded quantizer kernels.
pub(crate) struct Quantizers {
    sm_count: u32,
    amax: CudaFunction,
    kernels: Vec<(&'static QuantizeKernel, CudaFunction)>,
    /// The per-row FP8 quantizers (a row in one block, no maximum pass).
    rows: Vec<(&'static QuantizeKernel, CudaFunction)>,
}

/// What one quantization produced, before the GPU wraps it into a `DeviceMatrix`.
pub(crate) struct Quantized {
    pub desc: MatrixDesc,
    pub data: CudaSlice<u8>,
    pub scales: CudaSlice<u8>,
    /// The FP8 kernel's A-role scales `[l][k/128][m_pad]` and `m_pad` (FP8 with fp32 scales per
    /// 1×128, per row or per tensor, K a multiple of 128).
    pub sfa: Option<(CudaSlice<f32>, u32)>,
    pub swizzled: Option<CudaSlice<u8>>,
}

/// What a quantizer or a GEMM's quantized output writes, apart from its buffers: the matrix's
/// description and the kernels' view of its scales. Made (and checked) by [`QuantSpec::new`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct QuantSpec {
    pub desc: MatrixDesc,
    pub span: ScaleSpan,
    /// Elements of a 1×k block ([`ScaleSpan::Block`]).
    pub block_k: u32,
    /// Rows of the FP8 kernel's A-role scales `[l][k/128][m_pad]`, when the format has them.
    pub m_pad: u32,
    /// Whether the format has them (FP8 with fp32 scales per 1×128, per row or per tensor, K a
    /// multiple of 128).
    pub fp8_a: bool,
    /// Bytes of one batch entry of the 128×4 swizzled copy (0: none).
    pub swizzled_entry: usize,
    /// NVFP4's tensor scale when given.
    pub given: Option<f32>,
}

/// The buffers a quantizer writes (borrowed: a new matrix's, or one being rewritten).
pub(crate) struct QuantBufs<'a> {
    pub data: &'a mut dyn DevicePtrMut<u8>,
    pub scales: &'a mut dyn DevicePtrMut<u8>,
    pub swizzled: Option<&'a mut CudaSlice<u8>>,
    /// The FP8 kernel's A-role scales, zero in the padding rows (the kernel's last tiles read
    /// them), when `QuantSpec::fp8_a`.
    pub sfa: Option<&'a mut CudaSlice<f32>>,
    /// The MX kernel's scale layout `[l][⌈k/64⌉][rows_pad][64 / block]` and its `rows_pad`
    /// (one-byte scales per 1×16 or 1×32), zero past the rows and K already: a rewrite of a
    /// matrix prepared for that kernel writes its copy in place.
    pub mx: Option<(&'a mut CudaSlice<u8>, u32)>,
}

/// A quantized matrix's buffers before they are written: what the quantizer kernels and a GEMM's
/// quantized output write into, checked and allocated by one function.
pub(crate) struct QuantTarget {
    pub spec: QuantSpec,
    pub data: CudaSlice<u8>,
    pub scales: CudaSlice<u8>,
    pub swizzled: Option<CudaSlice<u8>>,
    pub sfa: Option<CudaSlice<f32>>,
}

impl QuantSpec {
    /// Checks `format` and `opts` for a `[l][rows][k]` matrix.
    pub(crate) fn new(
        format: OperandFormat,
        (rows, k, l): (usize, usize, usize),
        opts: &QuantizeOptions,
    ) -> Result<Self> {
        format.validate()?;
        let (span, block_k) = match format.block {
            ScaleBlock::Tile { rows: 1, k: bk } if matches!(bk, 16 | 32 | 128) => {
                (ScaleSpan::Block, bk)
            }
            ScaleBlock::PerRow => (ScaleSpan::Row, 0),
            ScaleBlock::PerTensor => (ScaleSpan::Entry, 0),
            _ => {
                return Err(format.error(
                    "the device quantizers take scale blocks of 1×16, 1×32 or 1×128, per row or \
                     per tensor (quantize 128×128-block weights with ScaledMatrix::quantize)",
                ));
            }
        };
        if !k.is_multiple_of(8) {
            return Err(Error::Alignment(format!(
                "the device quantizers take K a multiple of 8 (whole 8-element groups, 16 bytes of bf16 / fp16), not {k}"
            )));
        }
        // (Rows below 2^32 - 65536: the kernel's row index plus the grid's y stays a u32.)
        if rows == 0 || k == 0 || l == 0 || rows > (u32::MAX - 65536) as usize || l > 65535 {
            return Err(shape(format!(
                "{l}×{rows}×{k}: rows, K and batch must be non-zero, rows below 2^32 - 65536, batch \
                 at most 65535"
            )));
        }
        let nv = format.scale == ScaleType::UE4M3;
        let given = match opts.tensor_scale {
            Some(s) if !nv => {
                return Err(Error::Config(format!(
                    "a tensor scale ({s}) was given for {}, which has none",
                    format.scale.name()
                )));
            }
            Some(s) if !(s.is_finite() && s > 0.0) => {
                return Err(Error::Config(format!(
                    "NVFP4 tensor scale {s}: must be finite and positive"
                )));
            }
            s => s,
        };
        if opts.swizzled_scales && format.scale == ScaleType::F32 {
            return Err(format.error("the 128×4 swizzled layout holds one-byte scales (MX, NVFP4)"));
        }
        let major = opts.major.unwrap_or(ScaleMajor::default_for(&format));
        let (br, bk) = format.block.extent(rows, k);
        let layout = ScaleLayout::packed(major, rows.div_ceil(br), k.div_ceil(bk));
        let desc = MatrixDesc {
            format,
            rows,
            k,
            batch: l,
            scale_layout: layout,
            tensor_scale: given.unwrap_or(1.0),
        };
        desc.validate()?;
        let swizzled_entry = if opts.swizzled_scales {
            swizzled_128x4_len(layout.row_blocks, layout.k_blocks)
                .ok_or_else(|| shape("the swizzled scales' size overflows"))?
        } else {
            0
        };
        Ok(QuantSpec {
            desc,
            span,
            block_k,
            m_pad: blockscaled_kernels::sm90::m_pad(rows as u32),
            // (A scale per row or per tensor is the same for every 128 of K: the quantizer
            // writes it into each K block's entry.)
            fp8_a: format.scale == ScaleType::F32
                && k.is_multiple_of(128)
                && (span != ScaleSpan::Block || block_k == 128),
            swizzled_entry,
            given,
        })
    }
}

impl QuantTarget {
    /// Checks `format` and `opts` for a `[l][rows][k]` matrix ([`QuantSpec::new`]) and allocates
    /// its buffers: the codes and scales uninitialized (every byte is written, see below), the
    /// swizzled copy and the A-role scales zeroed.
    pub(crate) fn alloc(
        stream: &Arc<CudaStream>,
        format: OperandFormat,
        dims: (usize, usize, usize),
        opts: &QuantizeOptions,
    ) -> Result<Self> {
        let spec = QuantSpec::new(format, dims, opts)?;
        let (data_bytes, scale_bytes) = spec.desc.validate()?;
        let l = spec.desc.batch;
        // SAFETY: u8 has no invalid bit patterns, and the quantizer writes every byte of both
        // before anything reads them: each thread's 8 elements (K % 8 == 0: whole rows of codes),
        // and the scale of every block, row or entry of the packed layout (no gaps); so does a
        // GEMM's fused quantized output (every row below M, whole scale blocks: N_out a multiple
        // of the block). Not zeroed: a memset would add a second write of the codes to every
        // call.
        let data = unsafe { crate::alloc::uninit::<u8>(stream, data_bytes) }?;
        let scales = unsafe { crate::alloc::uninit::<u8>(stream, scale_bytes) }?;
        let swizzled = if spec.swizzled_entry > 0 {
            Some(crate::alloc::zeros::<u8>(stream, spec.swizzled_entry * l)?)
        } else {
            None
        };
        let sfa = if spec.fp8_a {
            Some(crate::alloc::zeros::<f32>(
                stream,
                l * (spec.desc.k / 128) * spec.m_pad as usize,
            )?)
        } else {
            None
        };
        Ok(QuantTarget {
            spec,
            data,
            scales,
            swizzled,
            sfa,
        })
    }

    /// The spec and the buffers, borrowed.
    pub(crate) fn parts(&mut self) -> (&mut QuantSpec, QuantBufs<'_>) {
        (
            &mut self.spec,
            QuantBufs {
                data: &mut self.data,
                scales: &mut self.scales,
                swizzled: self.swizzled.as_mut(),
                sfa: self.sfa.as_mut(),
                mx: None,
            },
        )
    }
}

impl Quantizers {
    pub(crate) fn load(module: &Arc<CudaModule>, sm_count: u32) -> Result<Self> {
        Ok(Quantizers {
            sm_count,
            amax: module.load_function(AMAX_KERNEL.name)?,
            kernels: kq::KERNELS
                .iter()
                .map(|k| Ok((k, module.load_function(k.info.name)?)))
                .collect::<Result<_>>()?,
            rows: kq::ROW_KERNELS
                .iter()
                .map(|k| Ok((k, module.load_function(k.info.name)?)))
                .collect::<Result<_>>()?,
        })
    }

    /// Quantizes `t` into a new matrix of `format`, with the scratch its rewrites reuse.
    pub(crate) fn quantize(
        &self,
        stream: &Arc<CudaStream>,
        t: &DeviceTensor,
        format: OperandFormat,
        opts: &QuantizeOptions,
    ) -> Result<(Quantized, crate::buffers::QuantScratch)> {
        let mut target = QuantTarget::alloc(stream, format, (t.rows, t.k, t.batch), opts)?;
        let mut scratch = crate::buffers::QuantScratch::default();
        let (spec, bufs) = target.parts();
        self.write(stream, t, spec, bufs, &mut scratch)?;
        let m_pad = target.spec.m_pad;
        let q = Quantized {
            desc: target.spec.desc,
            data: target.data,
            scales: target.scales,
            sfa: target.sfa.map(|s| (s, m_pad)),
            swizzled: target.swizzled,
        };
        Ok((q, scratch))
    }

    /// Quantizes `t` (of `spec`'s dimensions: the caller's check) into `bufs` (of `spec`'s
    /// sizes), and sets a computed NVFP4 tensor scale in `spec.desc`; the maxima in `scratch`.
    pub(crate) fn write(
        &self,
        stream: &Arc<CudaStream>,
        t: &DeviceTensor,
        spec: &mut QuantSpec,
        bufs: QuantBufs<'_>,
        scratch: &mut crate::buffers::QuantScratch,
    ) -> Result<()> {
        let (rows, k, l) = (t.rows, t.k, t.batch);
        let format = spec.desc.format;
        let func = self
            .kernels
            .iter()
            .find(|(d, _)| d.elem == format.elem && d.scale == format.scale && d.input == t.input)
            .map(|(_, f)| f)
            .ok_or_else(|| {
                format.error(
                    "the device quantizers write e4m3 / e5m2 with fp32 or e8m0 scales and e2m1 \
                     with e8m0 or ue4m3 scales",
                )
            })?;
        let layout = spec.desc.scale_layout;
        let nv = format.scale == ScaleType::UE4M3;
        // A scale per row whose lanes fit one block: the per-row kernel, which reduces the row's
        // maximum in the block and reads the input once (no maximum pass).
        let row_lanes = k.div_ceil(kq::quantize_elems(t.input) as usize);
        let row_kernel = match spec.span {
            ScaleSpan::Row if row_lanes <= kq::ROW_THREADS_MAX as usize => self
                .rows
                .iter()
                .find(|(d, _)| d.elem == format.elem && d.input == t.input)
                .map(|(_, f)| f),
            _ => None,
        };
        let amax_slots = match spec.span {
            ScaleSpan::Row if row_kernel.is_some() => 0,
            ScaleSpan::Row => l * rows,
            ScaleSpan::Entry => l,
            ScaleSpan::Block => 0,
        };
        let needs_tensor = nv && spec.given.is_none();
        // The maxima start at 0 (`red.max` raises them); cleared only where a pass writes them
        // (a memset is a launch of its own).
        let crate::buffers::QuantScratch {
            amax: amax_slot,
            tensor: tensor_slot,
        } = scratch;
        let mut amax = crate::buffers::QuantScratch::zeroed(amax_slot, stream, amax_slots)?;
        let mut tensor_amax =
            crate::buffers::QuantScratch::zeroed(tensor_slot, stream, needs_tensor as usize)?;

        let mut p = QuantizeParams {
            src: 0,
            dst: 0,
            scales: 0,
            scale_stride_l: layout.batch_stride as u64,
            scale_stride_r: layout.row_stride as u64,
            scale_stride_k: layout.k_stride as u64,
            swizzled: 0,
            swizzled_entry: spec.swizzled_entry as u64,
            sfa: 0,
            amax: 0,
            tensor_amax: 0,
            rows: rows as u32,
            k: k as u32,
            batch: l as u32,
            m_pad: spec.m_pad,
            input: t.input as u32,
            span: spec.span as u32,
            block_k: spec.block_k,
            tensor_scale: spec.given.unwrap_or(0.0),
            mx: 0,
            mx_rows_pad: 0,
            mx_per: 0,
            reverse: 0,
            _pad: 0,
        };
        if amax_slots > 0 || needs_tensor {
            let mut launch = Launch::new(stream, &self.amax)
                .grid(rows as u32, l as u32, 1)
                .block(QUANTIZE_THREADS, 1, 1)
                .shared_mem(kq::ROW_SHARED_BYTES);
            let mut q = p;
            q.src = launch.ptr(&t.buf);
            q.amax = amax.as_deref_mut().map_or(0, |a| launch.ptr_mut(a));
            q.tensor_amax = tensor_amax.as_deref_mut().map_or(0, |a| launch.ptr_mut(a));
            // SAFETY: `t.buf` holds l·rows·k elements of `t.input` (its constructor), k % 8 == 0;
            // the maxima are zeroed, `[l][rows]` or `[l]` by the span, one for the tensor; the
            // grid is rows × l blocks (rows < 2^32, l ≤ 65535) with a word of shared memory a warp.
            unsafe { launch.launch(&q) }?;
            // The pass read the rows from the first (a block a row, in order); the quantizer
            // reads them from the last, the ones the L2 still holds first.
            p.reverse = 1;
        }
        let (per_block, blocks) = kq::lanes(&p);
        let mut launch = if let Some(func) = row_kernel {
            // One block of the row's lanes in whole warps (64 registers a thread: as many blocks
            // an SM as the registers hold), the rows round y, a word of shared memory a warp.
            let threads = (row_lanes as u32).div_ceil(32) * 32;
            let per_sm = (65536 / (64 * threads)).clamp(1, 2048 / threads);
            let grid_y = (self.sm_count * per_sm).clamp(1, rows.min(65535) as u32);
            Launch::new(stream, func)
                .grid(1, grid_y, l as u32)
                .block(threads, 1, 1)
                .shared_mem(kq::ROW_SHARED_BYTES)
        } else {
            // x: a row's lanes; y: rows (each block goes round them, y at most the grid's
            // limit); z: the batch (≤ 65535, checked by `QuantSpec::new`).
            let grid_x = (per_block * blocks).div_ceil(QUANTIZE_THREADS);
            // One wave at the kernels' occupancy (`QUANTIZE_MIN_BLOCKS` blocks an SM): each
            // thread goes round several rows, its next rows' loads in flight during this row's
            // work, and no second wave leaves a tail (H100, 4096×7168 bf16: DeepSeek FP8
            // 38.1 → 37.4–37.6 µs, MXFP8 42.6 → 41.7–41.8, MXFP4 60.1 → 59.0–59.5 against two
            // waves; a wave and a half, 42.0 µs for DeepSeek). NVFP4 keeps two waves: its f64
            // quotients measured 78.3 → 80.0 µs with one.
            let waves = if nv { 2 } else { 1 };
            let grid_y = (self.sm_count * kq::QUANTIZE_MIN_BLOCKS * waves)
                .div_ceil(grid_x)
                .clamp(1, rows.min(65535) as u32);
            Launch::new(stream, func)
                .grid(grid_x, grid_y, l as u32)
                .block(QUANTIZE_THREADS, 1, 1)
        };
        p.src = launch.ptr(&t.buf);
        p.dst = launch.ptr_mut(bufs.data);
        p.scales = launch.ptr_mut(bufs.scales);
        p.swizzled = match bufs.swizzled {
            Some(b) => launch.ptr_mut(b),
            None => 0,
        };
        p.sfa = match bufs.sfa {
            Some(b) => launch.ptr_mut(b),
            None => 0,
        };
        if let Some((b, rows_pad)) = bufs.mx {
            let one_byte = format.scale != ScaleType::F32;
            if !(one_byte && spec.span == ScaleSpan::Block && matches!(spec.block_k, 16 | 32)) {
                return Err(
                    format.error("the MX kernel's scale layout holds 1×16 or 1×32 one-byte scales")
                );
            }
            if (rows_pad as usize) < rows
                || b.len() < l * k.div_ceil(64) * rows_pad as usize * (64 / spec.block_k as usize)
            {
                return Err(shape(
                    "the MX kernel's scale layout is smaller than the matrix's".to_string(),
                ));
            }
            p.mx = launch.ptr_mut(b);
            p.mx_rows_pad = rows_pad;
            p.mx_per = 64 / spec.block_k;
        }
        p.amax = launch.opt_ptr(amax.as_deref());
        p.tensor_amax = launch.opt_ptr(tensor_amax.as_deref());
        // SAFETY: as the maximum pass for `src`; `dst` holds the format's data bytes and `scales`
        // its packed layout (`spec.desc`, the buffers' sizes: the caller's), `swizzled` l
        // whole-tile entries, `sfa` l·(k/128)·m_pad f32 (rows ≤ m_pad), `mx` its layout (checked
        // above); the maxima were written by
        // the pass above where the span or NVFP4 needs them. The grid covers a row's lanes in x
        // and the batch in z; rows + y < 2^32 (`QuantSpec::new`).
        unsafe { launch.launch(&p) }?;
        if let Some(tensor_amax) = &tensor_amax {
            let m = stream.clone_dtoh(&**tensor_amax)?;
            stream.synchronize()?;
            spec.desc.tensor_scale = if m[0] == kq::NON_FINITE {
                f32::NAN
            } else {
                blockscaled_kernels::format::quantize::nvfp4_tensor_scale(
                    f32::from_bits(m[0]),
                    format.elem,
                )
            };
        }
        Ok(())
    }
}
