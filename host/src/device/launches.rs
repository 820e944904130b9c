//! The per-kind launches (dense, fused, quantized output, block-sparse, grouped), their plans,
//! and the checks they share.

use crate::bsr::{self, BsrMatrix, DeviceBsr};
use crate::buffers::{DeviceMatrix, DeviceOutput, Mem, MemMut, Prepared};
use crate::error::{Error, Result, shape};
use crate::families::fp8::Sm90Fp8;
use crate::families::half::Sm90Half;
use crate::families::{BsrOperands, Gemm, Rewritten, SparseGemm, StoredBlocks};
use crate::format::{ElemType, OperandFormat, ScaleType};
use crate::fused::{self, Epilogue, Fused, QuantOut};
use crate::grouped::{self, DeviceGroups, GroupLayout, GroupValues};
use crate::matrix::GemmShape;
use crate::plan::{self, Plan};
use crate::quantizer::{QuantSpec, QuantTarget, QuantizeOptions};

use crate::workspace::{Workspace, WorkspaceSize};

use super::Gpu;
use super::quantize::{a_role_scales, major_of, writable};

/// A dense call without an epilogue, as its launch takes it: the operands, the groups (if any),
/// the plan and the workspace.
#[derive(Clone, Copy)]
pub(crate) struct DenseCall<'c> {
    pub a: &'c DeviceMatrix<'c>,
    pub b: &'c DeviceMatrix<'c>,
    pub groups: Option<&'c DeviceGroups<'c>>,
    pub plan: Plan,
    pub work: &'c Workspace,
}

/// A dense, ungrouped call with an epilogue, as its launch takes it: the operands, the epilogue
/// (a plain one where the call has none) and the plan.
#[derive(Clone, Copy)]
pub(crate) struct EpilogueCall<'c> {
    pub a: &'c DeviceMatrix<'c>,
    pub b: &'c DeviceMatrix<'c>,
    pub epi: &'c Epilogue<'c>,
    pub plan: Plan,
    /// The workspace it runs in (the handle's, or the call's own bound to this GPU).
    pub work: &'c Workspace,
}

impl Gpu {
    /// The shape of `call`'s product, its operands and epilogue checked to belong to this GPU
    /// and to fit each other.
    fn check_epilogue_call(&self, call: &EpilogueCall<'_>) -> Result<GemmShape> {
        let s = self.check_operands(call.a, call.b)?;
        call.epi.check(self.dev.id, &s)?;
        Ok(s)
    }

    /// `call` into `c` ([`Error::Config`] where the plan's kernel cannot run the epilogue: the
    /// reference kernel; the kernels that compute Cᵀ; a tile or pair of element types without a
    /// fused kernel, see [`Gpu::fused_plan`]).
    pub(crate) fn fused_on(&self, call: EpilogueCall<'_>, c: &mut DeviceOutput) -> Result<()> {
        let s = self.check_epilogue_call(&call)?;
        self.dev.id.check(c.gpu, "the output")?;
        let EpilogueCall {
            a,
            b,
            epi,
            plan,
            work,
        } = call;
        let n_out = epi.out_cols(s.n);
        if (c.m, c.n, c.l) != (s.m, n_out, s.l) {
            return Err(shape(format!(
                "output is {}×{}×{} but the epilogue of A·Bᵀ is {}×{}×{}",
                c.l, c.m, c.n, s.l, s.m, n_out
            )));
        }
        plan.validate(&s)?;
        plan.check_fused(fused_needs((a, b), epi, None))?;
        let g = Gemm {
            stream: &self.stream,
            work,
            shape: s,
            a,
            b,
            c,
            groups: None,
            epi: (!epi.is_plain()).then_some(Fused { epi, quant: None }),
        };
        plan.launch(&self.dev.families, g)
    }

    /// `call` with its epilogue's output quantized into a new matrix of `format`.
    pub(crate) fn quantized_new_on(
        &self,
        call: EpilogueCall<'_>,
        (format, opts): (OperandFormat, &QuantizeOptions),
    ) -> Result<DeviceMatrix<'static>> {
        let s = self.check_epilogue_call(&call)?;
        let (a, b, epi, plan) = (call.a, call.b, call.epi, call.plan);
        let block = fused::quant_block(&format)? as usize;
        if opts.swizzled_scales {
            return Err(format.error(
                "a GEMM's quantized output has no swizzled copy of its scales (quantize the \
                 output with Gpu::quantize_with for one)",
            ));
        }
        if format.scale == ScaleType::UE4M3 && opts.tensor_scale.is_none() {
            return Err(Error::Config(
                "NVFP4 output needs QuantizeOptions::tensor_scale: the output's largest \
                 magnitude is not known before the GEMM writes it"
                    .into(),
            ));
        }
        let n_out = epi.out_cols(s.n);
        whole_blocks(n_out, block)?;
        plan.validate(&s)?;
        plan.check_fused(fused_needs((a, b), epi, Some(&format)))?;
        let mut t = QuantTarget::alloc(&self.stream, format, (s.m, n_out, s.l), opts)?;
        let spec = t.spec;
        let mut codes = Mem::ViewMut(t.data.slice_mut(..));
        let q = QuantOut {
            spec,
            scales: MemMut::View(t.scales.slice_mut(..)),
            sfa: t.sfa.as_mut(),
        };
        self.launch_quantized(s, call, &mut codes, q)?;
        drop(codes);
        let q = crate::quantizer::Quantized {
            desc: spec.desc,
            data: t.data,
            scales: t.scales,
            sfa: t.sfa.map(|s| (s, spec.m_pad)),
            swizzled: None,
        };
        Ok(self.finish_quantized(q)?.matrix)
    }

    /// `call` with its epilogue's output quantized into `dst`, a matrix of the output's shape and
    /// format made by [`Gpu::run_quantized_new`] or [`Gpu::quantize_with`] (the same checks as
    /// [`Gpu::quantize_into`]; an NVFP4 `dst`'s tensor scale is the one the output is quantized
    /// with), reusing its buffers: for FP8 with fp32 scales per 1×128 nothing but the GEMM's
    /// launch.
    pub(crate) fn quantized_into_on(
        &self,
        call: EpilogueCall,
        dst: &mut DeviceMatrix,
    ) -> Result<()> {
        let s = self.check_epilogue_call(&call)?;
        self.dev.id.check(dst.gpu, "the destination")?;
        let (a, b, epi, plan) = (call.a, call.b, call.epi, call.plan);
        writable(dst)?;
        let format = dst.desc.format;
        let block = fused::quant_block(&format)? as usize;
        let n_out = epi.out_cols(s.n);
        whole_blocks(n_out, block)?;
        let opts = QuantizeOptions {
            major: major_of(&dst.desc),
            tensor_scale: (format.scale == ScaleType::UE4M3).then_some(dst.desc.tensor_scale),
            swizzled_scales: false,
        };
        let spec = QuantSpec::new(format, (s.m, n_out, s.l), &opts)?;
        self.check_target(&spec, &dst.desc)?;
        plan.validate(&s)?;
        plan.check_fused(fused_needs((a, b), epi, Some(&format)))?;
        let sfa = a_role_scales(&mut dst.prepared, &spec);
        let written = Rewritten {
            sfa: sfa.is_some(),
            mx_scales: false,
        };
        let q = QuantOut {
            spec,
            scales: dst.scales.reborrow_mut()?,
            sfa,
        };
        self.launch_quantized(s, call, &mut dst.data, q)?;
        // (The tensor scale is the destination's own: a rewrite keeps it.)
        let finite = dst.desc.tensor_scale.is_finite();
        self.after_rewrite(dst, written, finite)
    }

    /// One launch of `plan` whose fused epilogue quantizes into `data` and `q`'s scales (checked
    /// by the caller): `data` is the launch's output, reborrowed.
    pub(super) fn launch_quantized(
        &self,
        s: GemmShape,
        call: EpilogueCall<'_>,
        data: &mut Mem<'_>,
        q: QuantOut<'_>,
    ) -> Result<()> {
        let n_out = call.epi.out_cols(s.n);
        let codes = data.reborrow_mut()?.into();
        let mut shell = fused::codes_shell(self.dev.id, codes, (s.m, n_out, s.l));
        let g = Gemm {
            stream: &self.stream,
            work: call.work,
            shape: s,
            a: call.a,
            b: call.b,
            c: &mut shell,
            groups: None,
            epi: Some(Fused {
                epi: call.epi,
                quant: Some(q),
            }),
        };
        call.plan.launch(&self.dev.families, g)
    }

    /// The plan [`Gpu::gemm_fused`] (`quantized` `None`) or [`Gpu::run_quantized_new`] would run:
    /// the plain plan where its kernel has a fused variant, else the nearest that has (the FP8
    /// 128 × 128 tile, e4m3 × e4m3; the 16-bit 128 × 128 tile; the MX 256-column tile, which
    /// also takes MX / NVFP4 pairs whose FP8 fold would be e5m2).
    pub fn fused_plan(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        quantized: Option<OperandFormat>,
    ) -> Result<Plan> {
        let s = self.check_operands(a, b)?;
        if let Some(f) = &quantized {
            fused::quant_block(f)?;
        }
        let needs = fused_needs((a, b), epi, quantized.as_ref());
        plan::choose_fused(self.dev.arch, self.dev.hw, &s, (&a.desc, &b.desc), needs)
    }

    /// The plan a dense GEMM of `a` and `b` runs by default.
    pub(crate) fn dense_plan(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<Plan> {
        let shape = self.check_operands(a, b)?;
        if let Some(p) = self.tuned_plan((&a.desc, &b.desc), &shape, None) {
            return Ok(p);
        }
        plan::choose_for(self.dev.arch, self.dev.hw, &shape, &a.desc, &b.desc)
    }

    /// The plan a block-sparse GEMM runs by default (its shape is the kernel's: M the dense
    /// operand's rows, N the sparse operand's).
    pub(crate) fn sparse_plan(&self, dense: &DeviceMatrix, sparse: &DeviceBsr) -> Result<Plan> {
        let s = self.check_bsr(dense, sparse)?;
        plan::choose_bsr(
            self.dev.arch,
            self.dev.hw.sm_count,
            &s,
            (sparse.elem, sparse.block, sparse.nnz()),
        )
    }

    /// The plan a grouped GEMM runs by default.
    pub(crate) fn grouped_plan_of(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
    ) -> Result<Plan> {
        let shape = self.check_grouped(a, b, groups)?;
        if let Some(p) = self.tuned_plan((&a.desc, &b.desc), &shape, Some(groups.count())) {
            return Ok(p);
        }
        plan::choose_grouped(&plan::GroupedProblem {
            arch: self.dev.arch,
            hw: self.dev.hw,
            shape,
            a: &a.desc,
            b: &b.desc,
            groups: groups.count(),
        })
    }

    /// Checks A, B, the groups (if any) and C, validates the plan for their shape and launches
    /// it.
    pub(crate) fn dense_on(&self, call: DenseCall<'_>, c: &mut DeviceOutput) -> Result<()> {
        let (a, b, groups, plan) = (call.a, call.b, call.groups, call.plan);
        let shape = match groups {
            None => {
                let s = self.check(a, b, c)?;
                plan.validate(&s)?;
                s
            }
            Some(groups) => {
                let s = self.check_grouped(a, b, groups)?;
                self.dev.id.check(c.gpu, "the output")?;
                if (c.m, c.n, c.l) != (s.m, s.n, s.l) {
                    return Err(shape(format!(
                        "output is {}×{}×{} but the grouped product is {}×{}×{}",
                        c.l, c.m, c.n, s.l, s.m, s.n
                    )));
                }
                plan.validate_grouped(&s)?;
                s
            }
        };
        let g = Gemm {
            stream: &self.stream,
            work: call.work,
            shape,
            a,
            b,
            c,
            groups,
            epi: None,
        };
        plan.launch(&self.dev.families, g)
    }

    /// Copies a validated block-sparse matrix to the GPU, with what the kernel families prepare
    /// of it (the sm90 kernel's tensor maps of its stored blocks).
    pub fn upload_bsr(&self, m: &BsrMatrix) -> Result<DeviceBsr> {
        // A tensor map needs a nonempty tensor: a matrix with no stored blocks gets one zero
        // block (never read: no segment has a position).
        let block_bytes = m.block() * m.block() * m.elem().bits() as usize / 8;
        let (values, col) = if m.nnz() == 0 {
            (
                crate::alloc::zeros::<u8>(&self.stream, block_bytes)?,
                crate::alloc::zeros::<i32>(&self.stream, 1)?,
            )
        } else {
            (
                crate::alloc::copy_of(&self.stream, m.values())?,
                crate::alloc::copy_of(&self.stream, m.col_indices())?,
            )
        };
        // (16-bit blocks have no scales: one unused zero keeps the buffer nonempty.)
        let scales = if m.scales().is_empty() {
            crate::alloc::zeros::<f32>(&self.stream, 1)?
        } else {
            crate::alloc::copy_of(&self.stream, m.scales())?
        };
        let mut prepared = Prepared::default();
        for family in self.dev.families.iter() {
            if let Some(p) = family.prepare_sparse(
                &self.stream,
                StoredBlocks {
                    matrix: m,
                    values: &values,
                },
            )? {
                prepared.insert(p);
            }
        }
        Ok(DeviceBsr {
            gpu: self.dev.id,
            elem: m.elem(),
            matrix_rows: m.rows(),
            cols: m.cols(),
            block: m.block(),
            nnz: m.nnz(),
            crow: m.crow_indices().to_vec(),
            _values: values,
            scales,
            col,
            prepared,
            work: Default::default(),
        })
    }

    /// The block-sparse call `g` on `plan` (`Plan::Sm90Fp8` or `Plan::Sm90Half` with a
    /// block-sparse tile: the chosen one, or the call's own).
    pub(crate) fn sparse_on(&self, g: SparseGemm<'_, '_>, plan: Plan) -> Result<()> {
        let (ops, c) = (g.ops, &g.c);
        let s = self.check_bsr(ops.dense, ops.sparse)?;
        self.dev.id.check(c.gpu, "the output")?;
        let (m, n) = bsr::output_dims(g.side, s.m, s.n);
        if (c.m, c.n, c.l) != (m, n, 1) {
            return Err(shape(format!(
                "output is {}×{}×{} but the block-sparse product is 1×{m}×{n}",
                c.l, c.m, c.n
            )));
        }
        match self.sparse_family(plan, ops.sparse, &s)? {
            SparseFamily::Fp8(f, cfg) => f.bsr_gemm(g, cfg),
            SparseFamily::Half(f, cfg) => f.bsr_gemm(g, cfg),
        }
    }

    /// The workspace a block-sparse call on `plan` takes ([`Gpu::workspace_size`]).
    pub(crate) fn sparse_workspace(
        &self,
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        plan: Plan,
    ) -> Result<WorkspaceSize> {
        let s = self.check_bsr(dense, sparse)?;
        let stream = &self.stream;
        let ops = BsrOperands {
            stream,
            dense,
            sparse,
        };
        match self.sparse_family(plan, sparse, &s)? {
            SparseFamily::Fp8(f, cfg) => f.bsr_workspace(ops, cfg),
            SparseFamily::Half(f, cfg) => f.bsr_workspace(ops, cfg),
        }
    }

    /// The block-sparse family `plan` runs on for `sparse`'s blocks, its configuration validated
    /// for `s`.
    fn sparse_family(
        &self,
        plan: Plan,
        sparse: &DeviceBsr,
        s: &GemmShape,
    ) -> Result<SparseFamily<'_>> {
        let hopper =
            || Error::Architecture("block-sparse GEMM has Hopper (sm_90a) kernels only".into());
        match (plan, sparse.elem) {
            (Plan::Sm90Fp8(cfg), ElemType::E4M3) => {
                cfg.validate_sparse(s)?;
                let family = self.dev.families.get::<Sm90Fp8>().ok_or_else(hopper)?;
                Ok(SparseFamily::Fp8(family, cfg))
            }
            (Plan::Sm90Half(cfg), ElemType::BF16 | ElemType::F16) => {
                cfg.validate_sparse(s, sparse.block)?;
                let family = self.dev.families.get::<Sm90Half>().ok_or_else(hopper)?;
                Ok(SparseFamily::Half(family, cfg))
            }
            (plan, elem) => Err(Error::Config(format!(
                "{plan:?}: block-sparse GEMM of {} blocks runs on the sm90 {} kernel",
                elem.name(),
                if elem == ElemType::E4M3 {
                    "FP8 kernel (Plan::Sm90Fp8)"
                } else {
                    "16-bit kernel (Plan::Sm90Half)"
                }
            ))),
        }
    }

    /// The dense and sparse operands belong to this GPU and fit: the kernel's shape (M the
    /// dense operand's rows, N the sparse one's).
    pub(super) fn check_bsr(&self, dense: &DeviceMatrix, sparse: &DeviceBsr) -> Result<GemmShape> {
        self.dev.id.check(dense.gpu, "the dense operand")?;
        self.dev.id.check(sparse.gpu, "the sparse operand")?;
        let d = &dense.desc;
        if d.k != sparse.cols || d.batch != 1 {
            return Err(shape(format!(
                "dense operand {}×{}×{} and sparse {}×{}: K must match and the batch be 1",
                d.batch, d.rows, d.k, sparse.matrix_rows, sparse.cols
            )));
        }
        Ok(GemmShape {
            m: d.rows,
            n: sparse.matrix_rows,
            k: d.k,
            l: 1,
        })
    }

    /// A contiguous grouped GEMM's groups from host values: group g ends at row `ends[g]`
    /// (non-decreasing, as torch's `offs`). [`Error::Shape`] for G = 0, a negative or a
    /// decreasing end. The module doc of `grouped` (and [`Gpu::grouped_gemm`]) has the layout.
    pub fn group_ends(&self, ends: &[i32]) -> Result<DeviceGroups<'static>> {
        self.groups(GroupLayout::Contiguous, ends)
    }

    /// A masked grouped GEMM's groups from host values: group g has `counts[g]` rows (≥ 0).
    pub fn group_counts(&self, counts: &[i32]) -> Result<DeviceGroups<'static>> {
        self.groups(GroupLayout::Masked, counts)
    }

    pub(super) fn groups(
        &self,
        layout: GroupLayout,
        values: &[i32],
    ) -> Result<DeviceGroups<'static>> {
        grouped::check_values(layout, values)?;
        Ok(DeviceGroups {
            gpu: self.dev.id,
            layout,
            values: GroupValues::Owned(crate::alloc::copy_of(&self.stream, values)?),
            host_top: values.iter().max().map(|&v| v as usize),
        })
    }

    /// Groups whose values the caller's kernels write on the device: `g` zeroed int32 values
    /// (every group empty until written). The GEMM kernels clamp what they find (module doc of
    /// `grouped`).
    pub fn device_groups(&self, layout: GroupLayout, g: usize) -> Result<DeviceGroups<'static>> {
        if g == 0 {
            return Err(shape("G = 0: a grouped GEMM needs at least one group"));
        }
        Ok(DeviceGroups {
            gpu: self.dev.id,
            layout,
            values: GroupValues::Owned(crate::alloc::zeros::<i32>(&self.stream, g)?),
            host_top: None,
        })
    }

    /// A, B and the groups belong to this GPU and fit together.
    pub(crate) fn check_grouped(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
    ) -> Result<GemmShape> {
        self.dev.id.check(a.gpu, "A")?;
        self.dev.id.check(b.gpu, "B")?;
        self.dev.id.check(groups.gpu, "the groups")?;
        grouped::grouped_shape(&a.desc, &b.desc, groups.desc())
    }

    /// A and B belong to this GPU and can be multiplied.
    pub(crate) fn check_operands(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<GemmShape> {
        self.dev.id.check(a.gpu, "A")?;
        self.dev.id.check(b.gpu, "B")?;
        GemmShape::of(&a.desc, &b.desc)
    }

    /// A, B and C belong to this GPU, and C is the shape of A · Bᵀ.
    pub(super) fn check(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &DeviceOutput,
    ) -> Result<GemmShape> {
        let s = self.check_operands(a, b)?;
        self.dev.id.check(c.gpu, "the output")?;
        if (c.m, c.n, c.l) != (s.m, s.n, s.l) {
            return Err(shape(format!(
                "output is {}×{}×{} but A·Bᵀ is {}×{}×{}",
                c.l, c.m, c.n, s.l, s.m, s.n
            )));
        }
        Ok(s)
    }
}

/// What `epi` with a quantized output of `format` (if any) needs of a plan.
pub(super) fn fused_needs(
    (a, b): (&DeviceMatrix, &DeviceMatrix),
    epi: &Epilogue<'_>,
    format: Option<&OperandFormat>,
) -> plan::FusedNeeds {
    let paired = epi.activation == crate::fused::Activation::SwiGlu;
    let block = format.map_or(0, |f| fused::quant_block(f).unwrap_or(0));
    plan::FusedNeeds {
        block_cols: block * if paired { 2 } else { 1 },
        elems: (a.desc.format.elem, b.desc.format.elem),
        in_registers: epi.in_registers(format.map(|f| (*f, block))),
    }
}

/// `Error::Alignment` unless a quantized output's `n_out` columns are whole scale blocks of
/// `block`: a block is quantized by the lanes that hold it.
pub(super) fn whole_blocks(n_out: usize, block: usize) -> Result<()> {
    if n_out.is_multiple_of(block) {
        Ok(())
    } else {
        Err(Error::Alignment(format!(
            "a quantized output's columns must be a multiple of its scale block ({block}), not \
             {n_out}: a block is quantized by the lanes that hold it"
        )))
    }
}

/// The family (and its configuration) a block-sparse GEMM runs on.
enum SparseFamily<'f> {
    Fp8(&'f Sm90Fp8, crate::families::fp8::Sm90Config),
    Half(&'f Sm90Half, crate::families::half::Sm90HalfConfig),
}
