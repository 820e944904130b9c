//! The device quantizers' calls, and a written matrix prepared for the GEMM kernels.

use cudarc::driver::CudaSlice;

use crate::buffers::{DeviceMatrix, DeviceOutput, Mem, Prepared};
use crate::error::{Error, Result, shape};
use crate::families::Rewritten;
use crate::families::fold::Sm90MxFp8;
use crate::families::operands::MxOperand;
use crate::families::operands::Sm90Operand;
use crate::format::OperandFormat;
use crate::prepare::Source;
use crate::quantizer::{DeviceQuantized, DeviceTensor, QuantBufs, QuantSpec, QuantizeOptions};
use blockscaled_kernels::quantize::ScaleSpan;

use super::Gpu;

impl Gpu {
    /// Quantizes `t` on the GPU into `format`, with the scale layout its users pass by default;
    /// bit-identical to [`ScaledMatrix::quantize`](crate::ScaledMatrix::quantize) on the same values. See
    /// [`quantize_with`](Self::quantize_with).
    pub fn quantize(
        &self,
        t: &DeviceTensor,
        format: OperandFormat,
    ) -> Result<DeviceMatrix<'static>> {
        Ok(self
            .quantize_with(t, format, &QuantizeOptions::default())?
            .matrix)
    }

    /// Quantizes `t` on the GPU: FP8 (e4m3, e5m2) with fp32 scales per 1×128 / 1×32 / 1×16, per
    /// row or per tensor, or e8m0 scales per 1×32 / 1×16 (MXFP8); e2m1 with e8m0 (MXFP4) or ue4m3
    /// scales and a tensor scale (NVFP4, computed or given). `opts` chooses the scale layout's
    /// major order, NVFP4's tensor scale, and a second copy of one-byte scales in the 128×4
    /// swizzled layout. [`Error::Format`] for another format, [`Error::Alignment`] for K not a
    /// multiple of 8. Non-finite input gives NaN scales (the host quantizer's `Error::Format`
    /// would need a wait). FP8 with fp32 scales per 1×128 (DeepSeek activations), per row or per
    /// tensor is written straight into the FP8 kernel's A-role layout too; every other copy a
    /// GEMM kernel reads of an activation (the MX kernel's scale layout, fp32 scale layouts) is
    /// made on the device from the quantizer's buffers, with no copy back. The copies only
    /// weights need (the FP8 kernel's B-role scales, each row's largest scale code for the fold,
    /// the 4-bit weights' reordered codes) are made, on the device too, when a GEMM first takes
    /// the matrix as weights: an activation quantized every step never pays for them.
    pub fn quantize_with(
        &self,
        t: &DeviceTensor,
        format: OperandFormat,
        opts: &QuantizeOptions,
    ) -> Result<DeviceQuantized> {
        self.dev.id.check(t.gpu, "the tensor")?;
        let (q, scratch) = self
            .dev
            .quantizers
            .quantize(&self.stream, t, format, opts)?;
        let mut q = self.finish_quantized(q)?;
        q.matrix.scratch = scratch;
        Ok(q)
    }

    /// Quantizes `t` into `dst`, a matrix of `t`'s dimensions made by [`Gpu::quantize_with`] (or
    /// [`Gpu::run_quantized_new`]) with the same options, reusing its buffers: no allocation, and for
    /// FP8 with fp32 scales per 1×128 nothing but the kernel (its tensor maps stay valid), so a
    /// serving loop quantizes each step's activations into the same matrix. `opts` as for
    /// `quantize_with`, but no swizzled copy (`Error::Config`), and `opts.major` `None` keeps
    /// `dst`'s order. The copies the GEMM kernels read beside the codes and scales are made
    /// again on the device, in their buffers. [`Error::Shape`] or [`Error::Format`] where `dst` is not a
    /// matrix of this shape and format.
    pub fn quantize_into(
        &self,
        t: &DeviceTensor,
        dst: &mut DeviceMatrix,
        opts: &QuantizeOptions,
    ) -> Result<()> {
        self.dev.id.check(t.gpu, "the tensor")?;
        self.dev.id.check(dst.gpu, "the destination")?;
        writable(dst)?;
        if opts.swizzled_scales {
            return Err(Error::Config(
                "quantize_into writes no swizzled copy of the scales (quantize_with makes one)"
                    .into(),
            ));
        }
        let opts = QuantizeOptions {
            major: opts.major.or_else(|| major_of(&dst.desc)),
            ..*opts
        };
        let mut spec = QuantSpec::new(dst.desc.format, (t.rows, t.k, t.batch), &opts)?;
        self.check_target(&spec, &dst.desc)?;
        let (sfa, mx) = quantizer_copies(&mut dst.prepared, &spec);
        let written = Rewritten {
            sfa: sfa.is_some(),
            mx_scales: mx.is_some(),
        };
        let bufs = QuantBufs {
            data: &mut dst.data,
            scales: &mut dst.scales,
            swizzled: None,
            sfa,
            mx,
        };
        let was_finite = dst.desc.tensor_scale.is_finite();
        self.dev
            .quantizers
            .write(&self.stream, t, &mut spec, bufs, &mut dst.scratch)?;
        dst.desc.tensor_scale = spec.desc.tensor_scale;
        self.after_rewrite(dst, written, was_finite)
    }

    /// A matrix of `format` and `dims` (rows, K, batch) for this crate's own device writers to
    /// fill (the MoE kernels' grouped rows): codes and scales uninitialized, prepared as a
    /// quantizer's output is. Each write is followed by [`Self::rewritten`].
    pub(crate) fn blank_matrix(
        &self,
        format: OperandFormat,
        dims: (usize, usize, usize),
    ) -> Result<DeviceMatrix<'static>> {
        let t = crate::quantizer::QuantTarget::alloc(
            &self.stream,
            format,
            dims,
            &QuantizeOptions::default(),
        )?;
        let m_pad = t.spec.m_pad;
        let q = crate::quantizer::Quantized {
            desc: t.spec.desc,
            data: t.data,
            scales: t.scales,
            sfa: t.sfa.map(|s| (s, m_pad)),
            swizzled: t.swizzled,
        };
        Ok(self.finish_quantized(q)?.matrix)
    }

    /// The copies the GEMM kernels read beside `m`'s codes and packed scales, made again on the
    /// device after a kernel of this crate rewrote them in place (the FP8 kernel's A-role
    /// scales too where `sfa`: those are not made again).
    pub(crate) fn rewritten(&self, m: &mut DeviceMatrix, sfa: bool) -> Result<()> {
        let written = Rewritten {
            sfa,
            mx_scales: false,
        };
        self.after_rewrite(m, written, true)
    }

    /// `Error::Shape` / `Error::Format` unless `dst` is the matrix `spec` describes (its tensor
    /// scale aside).
    pub(super) fn check_target(&self, spec: &QuantSpec, dst: &crate::MatrixDesc) -> Result<()> {
        let want = spec.desc;
        if (want.rows, want.k, want.batch) != (dst.rows, dst.k, dst.batch) {
            return Err(shape(format!(
                "the destination is {}×{}×{}, the values {}×{}×{}",
                dst.batch, dst.rows, dst.k, want.batch, want.rows, want.k
            )));
        }
        if want.format != dst.format || want.scale_layout != dst.scale_layout {
            return Err(Error::Format(format!(
                "the destination holds {:?} with scales {:?}, not the quantizer's {:?} with {:?}",
                dst.format, dst.scale_layout, want.format, want.scale_layout
            )));
        }
        Ok(())
    }

    /// A quantized matrix's buffers as a [`DeviceQuantized`], prepared for the GEMM kernels: FP8
    /// with fp32 scales per 1×128, per row or per tensor in the FP8 kernel's A-role layout the
    /// writer filled; the rest on the device ([`Gpu::prepare_on_device`]).
    pub(super) fn finish_quantized(
        &self,
        q: crate::quantizer::Quantized,
    ) -> Result<DeviceQuantized> {
        let mut prepared = Prepared::default();
        if let Some(sfa) = q.sfa {
            prepared.insert(Box::new(Sm90Operand::written(
                &self.stream,
                &q.desc,
                &q.data,
                Some(sfa),
            )?));
        }
        let mut matrix = DeviceMatrix {
            gpu: self.dev.id,
            desc: q.desc,
            data: Mem::Owned(q.data),
            scales: Mem::Owned(q.scales),
            prepared,
            scratch: Default::default(),
        };
        self.prepare_on_device(&mut matrix, false)?;
        Ok(DeviceQuantized {
            matrix,
            swizzled_scales: q.swizzled,
        })
    }

    /// `dst` after its codes and scales were rewritten in its buffers: each family's copies
    /// made again in place (their tensor maps stay valid; `written`: what the writer rewrote
    /// itself), or, where a family cannot or `dst` had none (a NaN tensor scale before:
    /// `was_finite` false), its preparation made anew.
    pub(super) fn after_rewrite(
        &self,
        dst: &mut DeviceMatrix,
        written: Rewritten,
        was_finite: bool,
    ) -> Result<()> {
        if was_finite && dst.desc.tensor_scale.is_finite() {
            // (Field by field: the families write `dst.prepared` while reading the rest.)
            let src = Source::Device {
                desc: dst.desc,
                scales: &dst.scales,
                kernels: &self.dev.preparers,
                unit_scale: false,
            };
            let families = &self.dev.families;
            if families.refresh_operand(&self.stream, &src, &mut dst.prepared, written)? {
                return Ok(());
            }
        }
        dst.prepared = Prepared::default();
        self.prepare_on_device(dst, false)
    }

    /// `m`, a matrix written on the device, prepared for the GEMM kernels that take it from its
    /// device buffers (`crate::prepare`: no copy back, no wait), each family seeing what `m`
    /// holds already (the A-role scales the quantizer wrote in place); nothing for a NaN tensor
    /// scale (non-finite input), which no kernel takes. Matrices over the caller's memory are
    /// prepared so too (`unit_scale`: a 16-bit one whose scale is 1, known to the host).
    pub(crate) fn prepare_on_device(&self, m: &mut DeviceMatrix, unit_scale: bool) -> Result<()> {
        if !m.desc.tensor_scale.is_finite() {
            return Ok(());
        }
        let src = Source::Device {
            desc: m.desc,
            scales: &m.scales,
            kernels: &self.dev.preparers,
            unit_scale,
        };
        let families = &self.dev.families;
        families.prepare_operand(&self.stream, &src, &m.data, &mut m.prepared)
    }

    /// What the families prepare of an output (its tensor maps).
    pub(crate) fn prepare_output(&self, out: &mut DeviceOutput<'_>) -> Result<()> {
        for family in self.dev.families.iter() {
            if let Some(p) = family.prepare_output(&self.stream, out)? {
                out.prepared.insert(p);
            }
        }
        Ok(())
    }

    /// Makes now every copy a GEMM makes of `m` at its first use as weights (B): the FP8 kernel's
    /// B-role scales, each row's largest scale code for the fold, the 4-bit weights' reordered
    /// codes. Call it once when the model's weights are loaded (over the caller's memory too):
    /// then no GEMM on them allocates or launches anything but itself. The copies live with `m`
    /// ([`DeviceMatrix::prepared_bytes`] says how much memory they take).
    pub fn prepare_weights(&self, m: &DeviceMatrix<'_>) -> Result<()> {
        self.dev.id.check(m.gpu, "the matrix")?;
        for family in self.dev.families.iter() {
            family.prepare_weights(&self.stream, m)?;
        }
        Ok(())
    }

    /// This MX or NVFP4 matrix folded to FP8 on the GPU, once, as the fold pre-pass does per
    /// call ([`ScaledMatrix::fold_to_fp8`](crate::ScaledMatrix::fold_to_fp8) is the host's bit-identical version; the desc is
    /// [`MatrixDesc::folded`](crate::MatrixDesc::folded)): for the B role (`as_b`), fp32 scales
    /// per row; for the A role, per 1×128. Fold a model's weights (a MoE's experts) at load
    /// time, and [`Gpu::gemm`] and [`Gpu::grouped_gemm`] run them on the FP8 kernels without
    /// folding them again (lossy within the stated bound, as the fold path: `Plan::Sm90MxFp8`).
    /// [`Error::Format`] for a matrix that does not fold, [`Error::Architecture`] without the
    /// sm90 fold kernels.
    pub fn fold_to_fp8(&self, m: &DeviceMatrix, as_b: bool) -> Result<DeviceMatrix<'static>> {
        self.dev.id.check(m.gpu, "the matrix")?;
        let fold = self.dev.families.get::<Sm90MxFp8>().ok_or_else(|| {
            Error::Architecture(
                "this GPU has no fold kernels (they need compute capability 9.0)".into(),
            )
        })?;
        let (desc, data, scales, op) = fold.fold_once(&self.stream, m, as_b)?;
        let mut prepared = Prepared::default();
        prepared.insert(Box::new(op));
        Ok(DeviceMatrix {
            gpu: self.dev.id,
            desc,
            data: Mem::Owned(data),
            scales: Mem::Owned(scales),
            prepared,
            scratch: Default::default(),
        })
    }
}

/// [`Error::Config`] unless `dst`'s codes and scales may be written (a read-only view may not).
pub(super) fn writable(dst: &DeviceMatrix) -> Result<()> {
    if dst.data.writable() && dst.scales.writable() {
        Ok(())
    } else {
        Err(Error::Config(
            "the destination is a read-only view of the caller's memory (make it with \
             Gpu::matrix_view_mut to write it)"
                .into(),
        ))
    }
}

/// The major order of `d`'s scales where they are packed (the quantizers' layouts); `None`
/// otherwise (the check that follows then names the difference).
pub(super) fn major_of(d: &crate::MatrixDesc) -> Option<crate::format::ScaleMajor> {
    use crate::format::ScaleMajor;
    use crate::matrix::ScaleLayout;
    let l = d.scale_layout;
    [ScaleMajor::K, ScaleMajor::Mn]
        .into_iter()
        .find(|&m| ScaleLayout::packed(m, l.row_blocks, l.k_blocks) == l)
}

/// The copies among a matrix's prepared data that the device quantizer rewrites itself, where
/// `spec`'s format has one: the FP8 kernel's A-role scales (FP8 with fp32 scales per 1×128, per
/// row or per tensor, [`a_role_scales`]) or
/// the MX kernel's scale layout and its `rows_pad` (one-byte scales per 1×16 or 1×32).
#[allow(clippy::type_complexity)]
pub(super) fn quantizer_copies<'a>(
    prepared: &'a mut Prepared,
    spec: &QuantSpec,
) -> (
    Option<&'a mut CudaSlice<f32>>,
    Option<(&'a mut CudaSlice<u8>, u32)>,
) {
    if spec.fp8_a {
        (a_role_scales(prepared, spec), None)
    } else if spec.span == ScaleSpan::Block && matches!(spec.block_k, 16 | 32) {
        (None, MxOperand::layout_scales_mut(prepared))
    } else {
        (None, None)
    }
}

/// The FP8 kernel's A-role scale copy among a matrix's prepared data, where `spec`'s format has
/// one (FP8 with fp32 scales per 1×128, per row or per tensor): a rewrite of the matrix writes
/// it in place.
pub(super) fn a_role_scales<'a>(
    prepared: &'a mut Prepared,
    spec: &QuantSpec,
) -> Option<&'a mut CudaSlice<f32>> {
    match prepared.get_mut::<Sm90Operand>() {
        Some(op) if spec.fp8_a => op.sfa.as_mut().map(|s| &mut s.0),
        _ => None,
    }
}
