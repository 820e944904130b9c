//! One description of a GEMM call: its operands (dense, or one block-sparse), an optional fused
//! epilogue, optional groups, and an optional plan ([`Call`]). [`Gpu::plan_call`] says what it
//! would launch, [`Gpu::run`] launches it into an output, [`Gpu::run_quantized`] into a
//! quantized matrix. The stream is the [`Gpu`] handle's ([`Gpu::with_stream`] makes one per
//! stream); the workspace the handle's, or the call's own ([`Call::workspace`], sized before by
//! [`Gpu::workspace_size`] and [`Gpu::reserve`]). The per-kind methods (`gemm`, `gemm_fused`,
//! `grouped_gemm`, `bsr_gemm`, `gemm_with`, and the `_plan` forms) are one-line wrappers over
//! it; a forced plan for any other kind is [`Call::with_plan`].

use crate::bsr::{DeviceBsr, SparseSide};
use crate::buffers::{DeviceMatrix, DeviceOutput};
use crate::device::Gpu;
use crate::device::{DenseCall, EpilogueCall};
use crate::error::{Error, Result};
use crate::families::{BsrOperands, Sizing, SparseGemm};
use crate::format::OperandFormat;
use crate::fused::Epilogue;
use crate::grouped::DeviceGroups;
use crate::plan::Plan;
use crate::quantizer::QuantizeOptions;
use crate::workspace::{Workspace, WorkspaceSize};

/// What the call multiplies.
#[derive(Clone, Copy)]
enum Operands<'a> {
    /// C = A · Bᵀ.
    Dense {
        a: &'a DeviceMatrix<'a>,
        b: &'a DeviceMatrix<'a>,
    },
    /// One operand block-sparse (`side`), the other dense.
    Sparse {
        dense: &'a DeviceMatrix<'a>,
        sparse: &'a DeviceBsr,
        side: SparseSide,
    },
}

/// One GEMM call described as data (see the module doc). Made with [`Call::new`] or
/// [`Call::sparse`], refined with [`Call::epilogue`], [`Call::groups`] and [`Call::with_plan`].
#[derive(Clone, Copy)]
pub struct Call<'a> {
    operands: Operands<'a>,
    epilogue: Option<&'a Epilogue<'a>>,
    groups: Option<&'a DeviceGroups<'a>>,
    plan: Option<Plan>,
    workspace: Option<&'a Workspace>,
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.operands {
            Operands::Dense { .. } => "dense",
            Operands::Sparse { .. } => "block-sparse",
        };
        f.debug_struct("Call")
            .field("operands", &kind)
            .field("epilogue", &self.epilogue.is_some())
            .field("groups", &self.groups.map(|g| g.count()))
            .field("plan", &self.plan)
            .field("workspace", &self.workspace.is_some())
            .finish()
    }
}

impl<'a> Call<'a> {
    /// C = A · Bᵀ for every batch entry.
    pub fn new(a: &'a DeviceMatrix<'a>, b: &'a DeviceMatrix<'a>) -> Self {
        Call {
            operands: Operands::Dense { a, b },
            epilogue: None,
            groups: None,
            plan: None,
            workspace: None,
        }
    }

    /// C = A · Bᵀ with the operand on `side` block-sparse (`sparse`, its missing blocks zeros) and
    /// `dense` the other one (FP8 with fp32 scales per 1×128, or 16-bit as the blocks; one batch
    /// entry). C is M × N: with B sparse, M = `dense`'s rows and N = `sparse`'s; with A sparse,
    /// the other way round. Each output tile runs over its block row's stored blocks only, long
    /// runs cut into parts summed in a fixed order (bitwise reproducible).
    pub fn sparse(dense: &'a DeviceMatrix<'a>, sparse: &'a DeviceBsr, side: SparseSide) -> Self {
        Call {
            operands: Operands::Sparse {
                dense,
                sparse,
                side,
            },
            epilogue: None,
            groups: None,
            plan: None,
            workspace: None,
        }
    }

    /// With the fused epilogue `epi` (α, β·C, bias, activation or SwiGLU, residual: see
    /// [`Epilogue`]) computed in the GEMM's kernel; the output has `n / 2` columns with SwiGLU.
    pub fn epilogue(self, epi: &'a Epilogue<'a>) -> Self {
        Call {
            epilogue: Some(epi),
            ..self
        }
    }

    /// Over `groups` (mixture of experts; `crate::grouped`'s module doc has the layouts): A holds
    /// every group's rows, B one expert per batch entry.
    pub fn groups(self, groups: &'a DeviceGroups<'a>) -> Self {
        Call {
            groups: Some(groups),
            ..self
        }
    }

    /// On `plan` rather than the one chosen for the operands ([`Error::Config`] at the launch
    /// where its kernel cannot run the call: [`Plan::validate`] and the family's checks).
    pub fn with_plan(self, plan: Plan) -> Self {
        Call {
            plan: Some(plan),
            ..self
        }
    }

    /// In `ws` (split K's partial sums and counters, the fold pre-pass's copies, a fused
    /// epilogue's staging) rather than the handle's own workspace: a workspace the caller made
    /// ([`Workspace::new`]), sized before the call ([`Gpu::workspace_size`], [`Gpu::reserve`]),
    /// and used in the order of the stream of the handle that runs the call (one workspace per
    /// stream that runs at once, as cuBLASLt's). [`Error::WrongGpu`] where `ws` was first used
    /// on another GPU.
    pub fn workspace(self, ws: &'a Workspace) -> Self {
        Call {
            workspace: Some(ws),
            ..self
        }
    }

    /// A dense call's operands, or `Error::Config` for a block-sparse one with `what`.
    fn dense(&self, what: &str) -> Result<(&'a DeviceMatrix<'a>, &'a DeviceMatrix<'a>)> {
        match self.operands {
            Operands::Dense { a, b } => Ok((a, b)),
            Operands::Sparse { .. } => Err(Error::Config(format!(
                "a block-sparse GEMM has no {what} (block-sparse: the plain product)"
            ))),
        }
    }

    /// `Error::Config` for a combination no kernel runs: groups with a fused epilogue, or a
    /// block-sparse operand with either.
    fn check_kind(&self) -> Result<()> {
        if self.groups.is_some() && self.fused().is_some() {
            return Err(grouped_fused());
        }
        if self.groups.is_some() || self.fused().is_some() {
            self.dense("fused epilogue or groups")?;
        }
        Ok(())
    }

    /// The epilogue where it changes the product (a plain one is none).
    fn fused(&self) -> Option<&'a Epilogue<'a>> {
        self.epilogue.filter(|e| !e.is_plain())
    }
}

impl Gpu {
    /// The plan [`Gpu::run`] would launch for `call` into an unquantized output: the call's own,
    /// or the one chosen for its operands ([`crate::plan::choose`], `choose_fused`,
    /// `choose_grouped`, `choose_bsr`).
    pub fn plan_call(&self, call: &Call<'_>) -> Result<Plan> {
        call.check_kind()?;
        if let Some(p) = call.plan {
            return Ok(p);
        }
        match call.operands {
            Operands::Sparse { dense, sparse, .. } => self.sparse_plan(dense, sparse),
            Operands::Dense { a, b } => match (call.groups, call.fused()) {
                (Some(g), None) => self.grouped_plan_of(a, b, g),
                (Some(_), Some(_)) => Err(grouped_fused()),
                (None, Some(epi)) => self.fused_plan(a, b, epi, None),
                (None, None) => self.dense_plan(a, b),
            },
        }
    }

    /// Launches `call` into `c` (the product's shape, or the epilogue's): asynchronous on this
    /// handle's stream, no host wait, no allocation once the handle's workspace has grown to the
    /// call's size. [`DeviceOutput::to_host`] waits for it.
    pub fn run(&self, call: &Call<'_>, c: &mut DeviceOutput<'_>) -> Result<()> {
        let plan = self.plan_call(call)?;
        let work = self.workspace_of(call)?;
        match call.operands {
            Operands::Sparse {
                dense,
                sparse,
                side,
            } => {
                let stream = self.stream();
                let g = SparseGemm {
                    work,
                    ops: BsrOperands {
                        stream,
                        dense,
                        sparse,
                    },
                    side,
                    c,
                };
                self.sparse_on(g, plan)
            }
            Operands::Dense { a, b } => match (call.groups, call.fused()) {
                (_, None) => {
                    let groups = call.groups;
                    self.dense_on(
                        DenseCall {
                            a,
                            b,
                            groups,
                            plan,
                            work,
                        },
                        c,
                    )
                }
                (Some(_), Some(_)) => Err(grouped_fused()),
                (None, Some(epi)) => self.fused_on(
                    EpilogueCall {
                        a,
                        b,
                        epi,
                        plan,
                        work,
                    },
                    c,
                ),
            },
        }
    }

    /// Launches `call` (dense, not grouped) with its epilogue's output quantized into `dst`, a
    /// matrix of the output's shape and format made by [`Gpu::run_quantized_new`] or
    /// [`Gpu::quantize_with`] (or over the caller's memory, [`Gpu::matrix_view_mut`]): FP8 with
    /// fp32 scales per 1×128, MXFP8 / MXFP4, or NVFP4 with `dst`'s tensor scale. Bit-identical to
    /// [`Gpu::quantize_with`] of the epilogue's f32 output; no allocation.
    pub fn run_quantized(&self, call: &Call<'_>, dst: &mut DeviceMatrix<'_>) -> Result<()> {
        let plain = Epilogue::default();
        let q = self.quantized_call(call, dst.desc.format, &plain)?;
        self.quantized_into_on(q, dst)
    }

    /// [`Gpu::run_quantized`] into a new matrix of `format` (`opts`: the scales' major order;
    /// NVFP4's tensor scale, which must be given: the output's largest magnitude is not known
    /// before it is written).
    pub fn run_quantized_new(
        &self,
        call: &Call<'_>,
        format: OperandFormat,
        opts: &QuantizeOptions,
    ) -> Result<DeviceMatrix<'static>> {
        let plain = Epilogue::default();
        let q = self.quantized_call(call, format, &plain)?;
        self.quantized_new_on(q, (format, opts))
    }

    /// The workspace `call` runs in: its own (bound to this GPU at its first use), or the
    /// handle's.
    fn workspace_of<'w>(&'w self, call: &Call<'w>) -> Result<&'w Workspace> {
        match call.workspace {
            Some(ws) => {
                ws.bind(self.id())?;
                Ok(ws)
            }
            None => Ok(self.handle_workspace()),
        }
    }

    /// The bytes of workspace `call` needs, by kind, where it runs as [`Gpu::run`] (`quantized`
    /// `None`) or as [`Gpu::run_quantized`] into `quantized` (a fused epilogue on the MX kernel
    /// stages rows; a quantized output may run on another plan). Nothing is allocated or
    /// launched: the same schedule the launch computes, sized. (A block-sparse call makes its
    /// sparse operand's work list, as its first run would.)
    pub fn workspace_size(
        &self,
        call: &Call<'_>,
        quantized: Option<OperandFormat>,
    ) -> Result<WorkspaceSize> {
        self.sized(call, quantized).map(|(_, need)| need)
    }

    /// The plan `call` runs on where it runs as [`Gpu::workspace_size`] sizes it, and the
    /// workspace it needs there.
    fn sized(
        &self,
        call: &Call<'_>,
        quantized: Option<OperandFormat>,
    ) -> Result<(Plan, WorkspaceSize)> {
        let (plan, fused) = match quantized {
            None => (self.plan_call(call)?, call.fused().is_some()),
            Some(format) => {
                let plain = Epilogue::default();
                (self.quantized_call(call, format, &plain)?.plan, true)
            }
        };
        let need = match call.operands {
            Operands::Sparse { dense, sparse, .. } => self.sparse_workspace(dense, sparse, plan),
            Operands::Dense { a, b } => {
                let s = match call.groups {
                    Some(g) => self.check_grouped(a, b, g)?,
                    None => self.check_operands(a, b)?,
                };
                plan.workspace(&Sizing {
                    families: self.families(),
                    a,
                    b,
                    shape: s,
                    groups: call.groups,
                    fused,
                })
            }
        }?;
        Ok((plan, need))
    }

    /// Grows `ws` now to what `call` needs ([`Gpu::workspace_size`]), so that running it there
    /// allocates nothing: split K's buffers and a fused epilogue's staging to at least their
    /// sizes, the fold pre-pass's copies to the call's operands. Nothing is launched.
    pub fn reserve(
        &self,
        ws: &Workspace,
        call: &Call<'_>,
        quantized: Option<OperandFormat>,
    ) -> Result<()> {
        ws.bind(self.id())?;
        let (plan, need) = self.sized(call, quantized)?;
        ws.reserve(self.stream(), &need)?;
        if need.fold > 0
            && let Operands::Dense { a, b } = call.operands
        {
            // (The 4-bit-weights kernel folds A alone: its weights stay as they are.)
            let fold_b = !matches!(plan, Plan::Sm90W4(_));
            self.reserve_fold(ws, (a, b), fold_b)?;
        }
        Ok(())
    }

    /// A quantized-output call's operands, epilogue (`plain` where it has none), plan (its
    /// own, or the one chosen for an output of `format`) and workspace: dense, not grouped.
    fn quantized_call<'c>(
        &'c self,
        call: &Call<'c>,
        format: OperandFormat,
        plain: &'c Epilogue<'c>,
    ) -> Result<EpilogueCall<'c>> {
        let (a, b) = call.dense("quantized output")?;
        if call.groups.is_some() {
            return Err(grouped_fused());
        }
        let epi = call.epilogue.unwrap_or(plain);
        let plan = match call.plan {
            Some(p) => p,
            None => self.fused_plan(a, b, epi, Some(format))?,
        };
        let work = self.workspace_of(call)?;
        Ok(EpilogueCall {
            a,
            b,
            epi,
            plan,
            work,
        })
    }

    /// C = A · Bᵀ for every batch entry, with the fastest kernel this GPU has for the formats
    /// ([`Gpu::run`] of [`Call::new`]). Asynchronous on [`Gpu::stream`]; [`DeviceOutput::to_host`]
    /// waits for it. [`Gpu::plan`] tells which kernel.
    pub fn gemm(&self, a: &DeviceMatrix, b: &DeviceMatrix, c: &mut DeviceOutput) -> Result<()> {
        self.run(&Call::new(a, b), c)
    }

    /// The plan [`Gpu::gemm`] would run for these operands.
    pub fn plan(&self, a: &DeviceMatrix, b: &DeviceMatrix) -> Result<Plan> {
        self.plan_call(&Call::new(a, b))
    }

    /// [`Gpu::gemm`] on a given plan (the runner's forced configurations); a plan the operands
    /// or this GPU cannot run is an error ([`Plan::validate`] says which).
    pub fn gemm_with(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
        plan: Plan,
    ) -> Result<()> {
        self.run(&Call::new(a, b).with_plan(plan), c)
    }

    /// C = A · Bᵀ with the SIMT reference kernel (float64 accumulation; for checking).
    pub fn reference_gemm(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        self.gemm_with(a, b, c, Plan::Reference)
    }

    /// `c` = the epilogue `epi` of A · Bᵀ, fused into the GEMM's kernel ([`Call::epilogue`]).
    pub fn gemm_fused(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        epi: &Epilogue<'_>,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        self.run(&Call::new(a, b).epilogue(epi), c)
    }

    /// Block-sparse GEMM ([`Call::sparse`]).
    pub fn bsr_gemm(
        &self,
        dense: &DeviceMatrix,
        sparse: &DeviceBsr,
        side: SparseSide,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        self.run(&Call::sparse(dense, sparse, side), c)
    }

    /// The plan [`Gpu::bsr_gemm`] would run (its shape is the kernel's: M the dense operand's
    /// rows, N the sparse operand's).
    pub fn bsr_plan(&self, dense: &DeviceMatrix, sparse: &DeviceBsr) -> Result<Plan> {
        self.plan_call(&Call::sparse(dense, sparse, SparseSide::B))
    }

    /// Grouped GEMM (mixture of experts), one persistent launch over every group's tiles
    /// ([`Call::groups`]):
    /// - contiguous groups: A is `R × K` (all groups' rows stacked, batch 1), B is `G × N × K`
    ///   (batch entry g: group g's expert), C is `R × N`; group g is rows `ends[g−1]..ends[g]`
    ///   of A and C; rows past the last end are not written;
    /// - masked groups: A is `G × capacity × K`, C is `G × capacity × N`; group g is the first
    ///   `counts[g]` rows of batch entry g; the rest are not written.
    ///
    /// No host synchronization for the groups (they stay on the GPU). Formats: FP8 with fp32
    /// scales, MX and NVFP4 pairs, and 4-bit experts (MXFP4 / NVFP4 B) with bf16 or FP8
    /// activations; MXFP4 experts and 4-bit experts with FP8 activations are folded to FP8 per
    /// call (`Plan::Sm90MxFp8`), and experts folded once by [`Gpu::fold_to_fp8`] run as FP8
    /// experts.
    pub fn grouped_gemm(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
        c: &mut DeviceOutput,
    ) -> Result<()> {
        self.run(&Call::new(a, b).groups(groups), c)
    }

    /// The plan [`Gpu::grouped_gemm`] would run.
    pub fn grouped_plan(
        &self,
        a: &DeviceMatrix,
        b: &DeviceMatrix,
        groups: &DeviceGroups,
    ) -> Result<Plan> {
        self.plan_call(&Call::new(a, b).groups(groups))
    }
}

fn grouped_fused() -> Error {
    Error::Config("grouped GEMM has no fused epilogue (the dense sm90 kernels have)".into())
}
