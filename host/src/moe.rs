//! Mixture-of-experts layers on the block-scaled kernels: the router's top-k on the GPU, the
//! tokens quantized to FP8 with fp32 scales per 1×128 and moved to their experts' rows, two
//! grouped GEMMs (gate/up, then down) with SwiGLU and the FP8 quantization between them in one
//! kernel, and each token's weighted sum of its experts' rows (`blockscaled_kernels::moe` has the
//! rules). Every count stays on the GPU: the grouped GEMMs read the groups the routing wrote, so
//! no step waits on the host and a layer can be captured in a CUDA graph.
//!
//! [`MoeLayer`] runs a layer whose experts are all on one GPU. With the `nccl` feature,
//! `ExpertParallel` splits the experts over GPUs, exchanging the tokens' codes and scales and
//! the experts' output rows with NCCL's all-to-all ([`crate::Ranks`]) in chunks of a fixed
//! capacity per peer. Both run the same kernels on the same rows, so an expert-parallel layer's
//! output equals the one-GPU layer's bit for bit where both run the grouped GEMMs on the same
//! plans (each row's products do not depend on the rows beside it).
//!
//! Weights are DeepSeek FP8 (e4m3, fp32 scales per 128×128): `w1` the experts' gate and up
//! projections interleaved row by row (`experts × 2·inter × hidden`, [`crate::interleave_gate_up`]),
//! `w2` the down projections (`experts × hidden × inter`).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaView};

use crate::buffers::{DeviceMatrix, DeviceOutput, Prepared};
use crate::device::Gpu;
use crate::error::{Error, Result, shape};
use crate::format::{OutType, Recipe};
use crate::grouped::{DeviceGroups, GroupLayout};
use crate::launch::{KernelParams, Launch};
use crate::matrix::MatrixDesc;
use crate::plan::Plan;
use crate::quantizer::{DeviceTensor, QuantizeOptions};
use crate::sm90_fp8::Sm90Operand;
use blockscaled_kernels::moe::{
    self as km, Combine, MAX_EXPERTS, MAX_TOP_K, MOE_THREADS, Offsets, Pack, Rank, Regroup,
    RegroupPlan, Route, ScaleRows, SwigluQuantize,
};
use blockscaled_kernels::quantize::InputType;

pub use blockscaled_kernels::moe::Scoring;

// SAFETY: `#[repr(C)]` structs of `blockscaled_kernels::moe`, the kernels' own parameter types:
// u64 addresses first, then 4-byte fields (`ScaleRows` four u32), an even number of them, so
// no padding.
unsafe impl KernelParams for Route {}
unsafe impl KernelParams for Rank {}
unsafe impl KernelParams for Offsets {}
unsafe impl KernelParams for Pack {}
unsafe impl KernelParams for RegroupPlan {}
unsafe impl KernelParams for Regroup {}
unsafe impl KernelParams for SwigluQuantize {}
unsafe impl KernelParams for Combine {}

/// A mixture-of-experts layer's dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeShape {
    /// The model's width: each token's features, the experts' input and output (a multiple of 128).
    pub hidden: usize,
    /// Each expert's intermediate width (a multiple of 128).
    pub inter: usize,
    /// Experts in the layer (all GPUs'), at most 1024.
    pub experts: usize,
    /// Experts each token chooses, at most 32 and at most `experts`.
    pub top_k: usize,
}

/// How a layer routes and lays out its rows.
#[derive(Clone, Copy, Debug)]
pub struct MoeOptions {
    /// The router's weights: softmax or sigmoid over the chosen logits.
    pub scoring: Scoring,
    /// The grouped GEMMs' layout: contiguous (rows packed expert after expert: prefill) or masked
    /// (a slot of `group_capacity` rows per expert: decode, a fixed shape for CUDA graphs).
    pub layout: GroupLayout,
    /// Rows a GPU sends each peer per step (expert parallelism). `None`: tokens · top_k, which
    /// drops nothing. Entries past it are dropped (they add nothing to their token's output).
    pub peer_capacity: Option<usize>,
    /// Rows per expert in the masked layout. `None`: every token once from each GPU, which drops
    /// nothing. Entries past it are dropped.
    pub group_capacity: Option<usize>,
    /// The two grouped GEMMs' plans; `None`: chosen per call ([`Gpu::grouped_plan`]).
    pub plans: Option<(Plan, Plan)>,
    /// The output's type: bf16 or f32.
    pub output: OutType,
}

impl Default for MoeOptions {
    fn default() -> Self {
        MoeOptions {
            scoring: Scoring::Softmax,
            layout: GroupLayout::Contiguous,
            peer_capacity: None,
            group_capacity: None,
            plans: None,
            output: OutType::Bf16,
        }
    }
}

/// The loaded MoE kernels.
#[derive(Clone)]
pub(crate) struct MoeKernels {
    sm_count: u32,
    route: CudaFunction,
    rank: CudaFunction,
    offsets: CudaFunction,
    pack: CudaFunction,
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    regroup_plan: CudaFunction,
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    regroup: CudaFunction,
    swiglu: CudaFunction,
    combine: CudaFunction,
}

impl MoeKernels {
    pub(crate) fn load(module: &Arc<CudaModule>, sm_count: u32) -> Result<Self> {
        let f = |k: blockscaled_kernels::registry::KernelInfo| module.load_function(k.name);
        Ok(MoeKernels {
            sm_count,
            route: f(km::ROUTE)?,
            rank: f(km::RANK)?,
            offsets: f(km::OFFSETS)?,
            pack: f(km::PACK)?,
            regroup_plan: f(km::REGROUP_PLAN)?,
            regroup: f(km::REGROUP)?,
            swiglu: f(km::SWIGLU_QUANTIZE)?,
            combine: f(km::COMBINE)?,
        })
    }

    /// Blocks for `items` (a block each, or `per_block` each), at most eight an SM.
    fn grid(&self, items: usize, per_block: usize) -> u32 {
        items
            .div_ceil(per_block)
            .clamp(1, 8 * self.sm_count as usize) as u32
    }
}

/// One launch of `func` with `p` (its addresses already taken: the buffers' guards live in
/// `launch`).
/// # Safety
/// `p` is `func`'s parameter struct, its addresses hold what it says for the grid and block.
unsafe fn go<P: KernelParams>(launch: Launch<'_>, p: P) -> Result<()> {
    // SAFETY: the caller's contract.
    unsafe { launch.launch(&p) }?;
    Ok(())
}

/// The last step's buffers, for checks and for engines that read the routing: the router's
/// choices and weights (`[tokens][top_k]`), each entry's row (`slot`, −1 where dropped), the
/// quantized tokens, the grouped rows and groups, and the grouped GEMMs' outputs.
pub struct MoeStep<'a> {
    /// i32 `[tokens][top_k]`: each token's experts, best first.
    pub chosen: CudaView<'a, i32>,
    /// f32 `[tokens][top_k]`: their weights.
    pub weights: CudaView<'a, f32>,
    /// i32 `[tokens][top_k]`: each entry's row (in the grouped rows on one GPU, in the peer
    /// chunks under expert parallelism), −1 where dropped.
    pub slot: CudaView<'a, i32>,
    /// The tokens, quantized (FP8, fp32 scales per 1×128).
    pub tokens: &'a DeviceMatrix<'static>,
    /// The grouped GEMMs' rows of this GPU's experts.
    pub grouped: &'a DeviceMatrix<'static>,
    /// Their groups (ends or counts), written on the GPU.
    pub groups: &'a DeviceGroups<'static>,
    /// The gate/up GEMM's output (bf16, `2·inter` columns).
    pub gate_up: &'a DeviceOutput<'static>,
    /// SwiGLU of it, quantized (FP8, fp32 scales per 1×128).
    pub hidden: &'a DeviceMatrix<'static>,
    /// The down GEMM's output (bf16).
    pub down: &'a DeviceOutput<'static>,
}

/// A step's buffers on one GPU, made at the first step of each token count.
pub(crate) struct Step {
    tokens: usize,
    xq: DeviceMatrix<'static>,
    chosen: CudaSlice<i32>,
    weights: CudaSlice<f32>,
    rank: CudaSlice<i32>,
    pub(crate) slot: CudaSlice<i32>,
    counts: CudaSlice<i32>,
    start: CudaSlice<i32>,
    /// Rows placed per expert, `[world][per_peer]`: what each peer is sent.
    pub(crate) sent: CudaSlice<u8>,
    pub(crate) chunks: Option<Chunks>,
    a: DeviceMatrix<'static>,
    groups: DeviceGroups<'static>,
    out1: DeviceOutput<'static>,
    h: DeviceMatrix<'static>,
    pub(crate) out2: DeviceOutput<'static>,
}

/// The chunks an expert-parallel step exchanges: `world` chunks of `capacity` rows each way
/// (the `nccl` feature's layer only).
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
pub(crate) struct Chunks {
    pub(crate) capacity: usize,
    pub(crate) send: CudaSlice<u8>,
    pub(crate) send_scales: CudaSlice<u8>,
    pub(crate) recv: CudaSlice<u8>,
    pub(crate) recv_scales: CudaSlice<u8>,
    pub(crate) recv_sent: CudaSlice<u8>,
    src_start: CudaSlice<i32>,
    dst_start: CudaSlice<i32>,
    pub(crate) back_send: CudaSlice<u8>,
    pub(crate) back_recv: CudaSlice<u8>,
}

/// One GPU's share of a layer: its experts (`first..first + local`), the layer's shape, and the
/// step buffers.
pub(crate) struct Local<'a> {
    pub(crate) gpu: &'a Gpu,
    w1: &'a DeviceMatrix<'a>,
    w2: &'a DeviceMatrix<'a>,
    shape: MoeShape,
    opts: MoeOptions,
    world: usize,
    pub(crate) step: Option<Step>,
}

/// fp32 scales per 1×128 of `m` (packed, one row per row block) as the kernels index them.
fn scale_rows(m: &DeviceMatrix) -> Result<ScaleRows> {
    let (d, l) = (&m.desc, m.desc.scale_layout);
    if l.row_blocks != d.rows || l.k_blocks * 128 != d.k {
        return Err(Error::Format(format!(
            "the MoE kernels take fp32 scales per 1×128, not {l:?}"
        )));
    }
    Ok(ScaleRows {
        batch_rows: d.rows as u32,
        row_stride: l.row_stride as u32,
        k_stride: l.k_stride as u32,
        batch_stride: l.batch_stride as u32,
        k_blocks: l.k_blocks as u32,
        pad: 0,
    })
}

/// The FP8 kernel's A-role scales of a matrix of `desc` (`[l][k/128][m_pad]`, kept in its
/// `prepared` copies), and their layout, where the matrix has them: the MoE kernels write them
/// beside the packed scales, so that no re-layout pass runs before the GEMM.
fn a_role<'m>(
    prepared: &'m mut Prepared,
    desc: &MatrixDesc,
) -> Option<(&'m mut CudaSlice<f32>, ScaleRows)> {
    let (sfa, m_pad) = prepared.get_mut::<Sm90Operand>()?.sfa.as_mut()?;
    let kb = (desc.k / 128) as u32;
    let layout = ScaleRows {
        batch_rows: desc.rows as u32,
        row_stride: 1,
        k_stride: *m_pad,
        batch_stride: kb * *m_pad,
        k_blocks: kb,
        pad: 0,
    };
    Some((sfa, layout))
}

/// A-role scales' address and layout for a launch (0 where the matrix has none).
fn a_role_ptr<'l>(
    l: &mut Launch<'l>,
    prepared: &'l mut Prepared,
    desc: &MatrixDesc,
) -> (u64, ScaleRows) {
    match a_role(prepared, desc) {
        Some((sfa, layout)) => (l.ptr_mut(sfa), layout),
        None => (0, ScaleRows::rows(0)),
    }
}

/// Whether `m` has the A-role scales [`a_role`] finds (then the MoE kernels wrote them).
fn has_a_role(m: &DeviceMatrix) -> bool {
    m.prepared
        .get::<Sm90Operand>()
        .is_some_and(|o| o.sfa.is_some())
}

impl<'a> Local<'a> {
    /// Checks the shape, the options and this GPU's experts (`world` GPUs' share each).
    pub(crate) fn new(
        gpu: &'a Gpu,
        shape: MoeShape,
        (w1, w2): (&'a DeviceMatrix<'a>, &'a DeviceMatrix<'a>),
        opts: MoeOptions,
        world: usize,
    ) -> Result<Self> {
        let s = shape;
        if s.hidden == 0
            || s.inter == 0
            || !s.hidden.is_multiple_of(128)
            || !s.inter.is_multiple_of(128)
        {
            return Err(shape_err(format!(
                "hidden {} and inter {} must be positive multiples of 128 (FP8 scales per 1×128)",
                s.hidden, s.inter
            )));
        }
        if s.experts == 0 || s.experts > MAX_EXPERTS as usize || !s.experts.is_multiple_of(world) {
            return Err(shape_err(format!(
                "{} experts: 1 to {MAX_EXPERTS}, a multiple of the {world} GPUs",
                s.experts
            )));
        }
        if s.top_k == 0 || s.top_k > (MAX_TOP_K as usize).min(s.experts) {
            return Err(shape_err(format!(
                "top-k {} of {} experts: 1 to {}",
                s.top_k,
                s.experts,
                (MAX_TOP_K as usize).min(s.experts)
            )));
        }
        if !matches!(opts.output, OutType::Bf16 | OutType::F32) {
            return Err(Error::Config(format!(
                "a MoE layer writes bf16 or f32, not {:?}",
                opts.output
            )));
        }
        let local = s.experts / world;
        for (name, w, rows, k) in [
            ("w1", w1, 2 * s.inter, s.hidden),
            ("w2", w2, s.hidden, s.inter),
        ] {
            gpu.id().check(w.gpu, name)?;
            let d = &w.desc;
            if d.format != Recipe::DeepSeekFp8.b() {
                return Err(Error::Format(format!(
                    "{name} is {:?}: MoE experts are DeepSeek FP8 weights (e4m3, fp32 per 128×128)",
                    d.format
                )));
            }
            if (d.batch, d.rows, d.k) != (local, rows, k) {
                return Err(shape_err(format!(
                    "{name} is {}×{}×{}, this GPU's {local} experts need {local}×{rows}×{k}",
                    d.batch, d.rows, d.k
                )));
            }
        }
        Ok(Local {
            gpu,
            w1,
            w2,
            shape,
            opts,
            world,
            step: None,
        })
    }

    fn local(&self) -> usize {
        self.shape.experts / self.world
    }

    /// Rows a peer chunk holds, and the grouped rows' count and masked capacity.
    fn sizes(&self, tokens: usize) -> (usize, usize, usize) {
        let entries = tokens * self.shape.top_k;
        let chunk = self.opts.peer_capacity.unwrap_or(entries).max(1);
        let gcap = self
            .opts
            .group_capacity
            .unwrap_or(self.world * tokens)
            .max(1);
        let rows = match self.opts.layout {
            GroupLayout::Contiguous if self.world == 1 => entries,
            GroupLayout::Contiguous => self.world * chunk,
            GroupLayout::Masked => self.local() * gcap,
        };
        (chunk, rows, gcap)
    }

    /// The step buffers for `tokens` (made at the first step of that count).
    fn step_for(&mut self, tokens: usize) -> Result<()> {
        if self.step.as_ref().is_some_and(|s| s.tokens == tokens) {
            return Ok(());
        }
        self.step = None;
        let (g, s) = (self.gpu, self.shape);
        let st = g.stream();
        let fmt = Recipe::DeepSeekFp8.a();
        let entries = tokens * s.top_k;
        let (chunk, rows, gcap) = self.sizes(tokens);
        if rows.max(self.world * chunk) > i32::MAX as usize / 2 || entries > i32::MAX as usize {
            return Err(shape_err(format!(
                "{tokens} tokens move {rows} rows: more than i32 row indices address"
            )));
        }
        let local = self.local();
        let (a_rows, batch) = match self.opts.layout {
            GroupLayout::Contiguous => (rows, 1),
            GroupLayout::Masked => (gcap, local),
        };
        let z32 = |n: usize| crate::alloc::zeros::<i32>(st, n.max(1));
        let z8 = |n: usize| crate::alloc::zeros::<u8>(st, n.max(1));
        let chunks = if self.world > 1 {
            let codes = self.world * chunk * s.hidden;
            let scales = self.world * chunk * (s.hidden / 128) * 4;
            Some(Chunks {
                capacity: chunk,
                send: z8(codes)?,
                send_scales: z8(scales)?,
                recv: z8(codes)?,
                recv_scales: z8(scales)?,
                recv_sent: z8(4 * s.experts)?,
                src_start: z32(s.experts)?,
                dst_start: z32(s.experts)?,
                back_send: z8(2 * codes)?,
                back_recv: z8(2 * codes)?,
            })
        } else {
            None
        };
        let groups = g.device_groups(self.opts.layout, local)?;
        self.step = Some(Step {
            tokens,
            xq: g.blank_matrix(fmt, (tokens, s.hidden, 1))?,
            chosen: z32(entries)?,
            weights: crate::alloc::zeros::<f32>(st, entries)?,
            rank: z32(entries)?,
            slot: z32(entries)?,
            counts: z32(s.experts)?,
            start: z32(s.experts)?,
            sent: z8(4 * s.experts)?,
            chunks,
            a: g.blank_matrix(fmt, (a_rows, s.hidden, batch))?,
            groups,
            out1: g.output(a_rows, 2 * s.inter, batch, OutType::Bf16)?,
            h: g.blank_matrix(fmt, (a_rows, s.inter, batch))?,
            out2: g.output(a_rows, s.hidden, batch, OutType::Bf16)?,
        });
        Ok(())
    }

    /// Quantizes the tokens, routes them and packs each entry's row: into the grouped rows on
    /// one GPU, into the peers' chunks otherwise.
    pub(crate) fn dispatch(&mut self, x: &DeviceTensor, logits: &DeviceTensor) -> Result<()> {
        let (g, s) = (self.gpu, self.shape);
        g.id().check(x.gpu, "the tokens")?;
        g.id().check(logits.gpu, "the router logits")?;
        let tokens = x.rows;
        if (x.k, x.batch) != (s.hidden, 1) || tokens == 0 {
            return Err(shape_err(format!(
                "the tokens are {}×{}×{}: tokens × hidden ({}), batch 1",
                x.batch, x.rows, x.k, s.hidden
            )));
        }
        if (logits.rows, logits.k, logits.batch) != (tokens, s.experts, 1) {
            return Err(shape_err(format!(
                "the router logits are {}×{}×{}, not tokens ({tokens}) × experts ({})",
                logits.batch, logits.rows, logits.k, s.experts
            )));
        }
        if logits.input != InputType::F32 {
            return Err(Error::Format(format!(
                "the router logits are {:?}: f32 expected",
                logits.input
            )));
        }
        self.step_for(tokens)?;
        let (chunk, _, gcap) = self.sizes(tokens);
        let (world, local) = (self.world, self.local());
        let masked = self.opts.layout == GroupLayout::Masked;
        let k = self.gpu.moe_kernels();
        let st = g.stream();
        let step = self.step.as_mut().expect("made above");
        g.quantize_into(x, &mut step.xq, &QuantizeOptions::default())?;
        let entries = tokens * s.top_k;
        let warps = (MOE_THREADS / 32) as usize;

        let mut l = Launch::new(st, &k.route)
            .grid(k.grid(tokens, warps), 1, 1)
            .block(MOE_THREADS, 1, 1);
        let p = Route {
            logits: l.ptr(&logits.buf),
            chosen: l.ptr_mut(&mut step.chosen),
            weights: l.ptr_mut(&mut step.weights),
            tokens: tokens as u32,
            experts: s.experts as u32,
            top_k: s.top_k as u32,
            scoring: self.opts.scoring as u32,
        };
        // SAFETY: logits `tokens × experts` f32 (checked), outputs of `entries` each.
        unsafe { go(l, p) }?;

        let mut l = Launch::new(st, &k.rank)
            .grid(s.experts as u32, 1, 1)
            .block(MOE_THREADS, 1, 1)
            .shared_mem(128);
        let p = Rank {
            chosen: l.ptr(&step.chosen),
            rank: l.ptr_mut(&mut step.rank),
            counts: l.ptr_mut(&mut step.counts),
            entries: entries as u32,
            experts: s.experts as u32,
        };
        // SAFETY: `entries` choices and ranks, `experts` counts; a block per expert.
        unsafe { go(l, p) }?;

        // One GPU: the chunk is the grouped rows (contiguous: every entry fits).
        let one = world == 1;
        let capacity = match (one, masked) {
            (_, true) if one => gcap,
            (true, false) => entries,
            _ => chunk,
        };
        let threads = s.experts.next_multiple_of(32) as u32;
        let mut l = Launch::new(st, &k.offsets)
            .block(threads, 1, 1)
            .shared_mem(128 + 4 * s.experts as u32);
        let groups = if one {
            l.ptr_mut(owned(&mut step.groups)?)
        } else {
            0
        };
        let p = Offsets {
            counts: l.ptr(&step.counts),
            start: l.ptr_mut(&mut step.start),
            sent: l.ptr_mut(&mut step.sent),
            groups,
            experts: s.experts as u32,
            per_peer: local as u32,
            capacity: capacity as u32,
            masked: (one && masked) as u32,
        };
        // SAFETY: `experts` words each (the groups: one GPU's `experts` groups), one block of a
        // thread per expert with its shared words.
        unsafe { go(l, p) }?;
        step.groups.host_top = None;

        let kb = (s.hidden / 128) as u32;
        let src_scale = scale_rows(&step.xq)?;
        let mut l = Launch::new(st, &k.pack)
            .grid(k.grid(entries, 1), 1, 1)
            .block(MOE_THREADS, 1, 1);
        let (dst_codes, dst_scales, dst_scale, (dst_scales2, dst_scale2)) = match &mut step.chunks {
            Some(c) => (
                l.ptr_mut(&mut c.send),
                l.ptr_mut(&mut c.send_scales),
                ScaleRows::rows(kb),
                (0, ScaleRows::rows(0)),
            ),
            None => {
                let rows = scale_rows(&step.a)?;
                let a = &mut step.a;
                (
                    l.ptr_mut(&mut a.data),
                    l.ptr_mut(&mut a.scales),
                    rows,
                    a_role_ptr(&mut l, &mut a.prepared, &a.desc),
                )
            }
        };
        let p = Pack {
            chosen: l.ptr(&step.chosen),
            rank: l.ptr(&step.rank),
            start: l.ptr(&step.start),
            sent: l.ptr(&step.sent),
            slot: l.ptr_mut(&mut step.slot),
            src_codes: l.ptr(&step.xq.data),
            src_scales: l.ptr(&step.xq.scales),
            dst_codes,
            dst_scales,
            dst_scales2,
            src_scale,
            dst_scale,
            dst_scale2,
            entries: entries as u32,
            top_k: s.top_k as u32,
            row_bytes: s.hidden as u32,
            experts: s.experts as u32,
        };
        // SAFETY: each placed entry's row is below the destination's rows (the offsets keep
        // every start + rank below the chunks' or groups' capacity); rows of `hidden` bytes.
        unsafe { go(l, p) }?;
        Ok(())
    }

    /// The received chunks into the grouped rows (`to_groups`), or the experts' output rows back
    /// into the chunks.
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn regroup(&mut self, to_groups: bool) -> Result<()> {
        let (g, s, world, local) = (self.gpu, self.shape, self.world, self.local());
        let k = g.moe_kernels();
        let st = g.stream();
        let tokens = self.step.as_ref().ok_or_else(no_step)?.tokens;
        let gcap = match self.opts.layout {
            GroupLayout::Masked => self.sizes(tokens).2 as u32,
            GroupLayout::Contiguous => 0,
        };
        let step = self.step.as_mut().ok_or_else(no_step)?;
        let Some(c) = step.chunks.as_mut() else {
            return Err(Error::Config("one GPU's layer exchanges no chunks".into()));
        };
        if to_groups {
            let pairs = (world * local) as u32;
            let mut l = Launch::new(st, &k.regroup_plan)
                .block(pairs.next_multiple_of(32), 1, 1)
                .shared_mem(128 + 8 * pairs);
            let p = RegroupPlan {
                sent: l.ptr(&c.recv_sent),
                src_start: l.ptr_mut(&mut c.src_start),
                dst_start: l.ptr_mut(&mut c.dst_start),
                groups: l.ptr_mut(owned(&mut step.groups)?),
                world: world as u32,
                per_peer: local as u32,
                group_capacity: gcap,
                pad: 0,
            };
            // SAFETY: `world · local` counts and starts, `local` groups; one block of a thread
            // per pair with its shared words.
            unsafe { go(l, p) }?;
            step.groups.host_top = None;
        }
        let kb = (s.hidden / 128) as u32;
        let group_scale = scale_rows(&step.a)?;
        let mut l = Launch::new(st, &k.regroup)
            .grid(k.grid(world * c.capacity, 1), 1, 1)
            .block(MOE_THREADS, 1, 1);
        let a = &mut step.a;
        let (chunk_rows, chunk_scales, group_rows, group_scales, row_bytes, second) = if to_groups {
            (
                l.ptr(&c.recv),
                l.ptr(&c.recv_scales),
                l.ptr_mut(&mut a.data),
                l.ptr_mut(&mut a.scales),
                s.hidden,
                a_role_ptr(&mut l, &mut a.prepared, &a.desc),
            )
        } else {
            (
                l.ptr_mut(&mut c.back_send),
                0,
                l.ptr(&step.out2.buf),
                0,
                2 * s.hidden,
                (0, ScaleRows::rows(0)),
            )
        };
        let p = Regroup {
            sent: l.ptr(&c.recv_sent),
            src_start: l.ptr(&c.src_start),
            dst_start: l.ptr(&c.dst_start),
            chunk_rows,
            chunk_scales,
            group_rows,
            group_scales,
            group_scales2: second.0,
            chunk_scale: ScaleRows::rows(kb),
            group_scale,
            group_scale2: second.1,
            world: world as u32,
            per_peer: local as u32,
            capacity: c.capacity as u32,
            group_capacity: gcap,
            row_bytes: row_bytes as u32,
            to_groups: to_groups as u32,
        };
        // SAFETY: the plan above keeps every grouped row below the grouped rows' count (a
        // contiguous layout holds `world · capacity`, a masked one checks its capacity), chunk
        // rows below `world · capacity`.
        unsafe { go(l, p) }
    }

    /// The experts: gate/up GEMM, SwiGLU quantized to FP8 per 1×128, down GEMM.
    pub(crate) fn experts(&mut self) -> Result<()> {
        let (g, s) = (self.gpu, self.shape);
        let k = g.moe_kernels();
        let plans = self.opts.plans;
        let step = self.step.as_mut().ok_or_else(no_step)?;
        let written = has_a_role(&step.a);
        g.rewritten(&mut step.a, written)?;
        match plans {
            Some((p1, _)) => {
                g.grouped_gemm_with(&step.a, self.w1, &step.groups, &mut step.out1, p1)?
            }
            None => g.grouped_gemm(&step.a, self.w1, &step.groups, &mut step.out1)?,
        }
        let rows = step.out1.m * step.out1.l;
        let masked = step.groups.layout == GroupLayout::Masked;
        let mut l = Launch::new(g.stream(), &k.swiglu)
            .grid(
                k.grid(
                    rows * (s.inter / 128).div_ceil(km::SWIGLU_BLOCKS as usize),
                    (MOE_THREADS / 32) as usize,
                ),
                1,
                1,
            )
            .block(MOE_THREADS, 1, 1);
        let scale = scale_rows(&step.h)?;
        let h = &mut step.h;
        let (scales2, scale2) = a_role_ptr(&mut l, &mut h.prepared, &h.desc);
        let p = SwigluQuantize {
            src: l.ptr(&step.out1.buf),
            codes: l.ptr_mut(&mut h.data),
            scales: l.ptr_mut(&mut h.scales),
            scales2,
            groups: l.ptr(&step.groups.values),
            scale,
            scale2,
            rows: rows as u32,
            cols: s.inter as u32,
            group_count: step.groups.count() as u32,
            group_capacity: if masked { step.out1.m as u32 } else { 0 },
        };
        // SAFETY: `rows × 2·inter` bf16 in, `rows × inter` codes and their scales out.
        unsafe { go(l, p) }?;
        let written = has_a_role(&step.h);
        g.rewritten(&mut step.h, written)?;
        match plans {
            Some((_, p2)) => {
                g.grouped_gemm_with(&step.h, self.w2, &step.groups, &mut step.out2, p2)
            }
            None => g.grouped_gemm(&step.h, self.w2, &step.groups, &mut step.out2),
        }
    }

    /// Each token's weighted sum of its entries' rows into `out`: the rows the experts returned
    /// (expert parallelism) or the down GEMM's own.
    pub(crate) fn combine(&mut self, out: &mut DeviceOutput) -> Result<()> {
        let (g, s) = (self.gpu, self.shape);
        let step = self.step.as_ref().ok_or_else(no_step)?;
        g.id().check(out.gpu, "the output")?;
        if (out.m, out.n, out.l, out.dtype) != (step.tokens, s.hidden, 1, self.opts.output) {
            return Err(shape_err(format!(
                "the output is {}×{}×{} {:?}, the layer writes {}×{}×1 {:?}",
                out.l, out.m, out.n, out.dtype, step.tokens, s.hidden, self.opts.output
            )));
        }
        if !out.buf.writable() {
            return Err(Error::Config("the output is read-only".into()));
        }
        let k = g.moe_kernels();
        let mut l = Launch::new(g.stream(), &k.combine)
            .grid(k.grid(step.tokens, 1), 1, 1)
            .block(MOE_THREADS, 1, 1);
        let rows = match &step.chunks {
            Some(c) => l.ptr(&c.back_recv),
            None => l.ptr(&step.out2.buf),
        };
        let p = Combine {
            rows,
            slot: l.ptr(&step.slot),
            weights: l.ptr(&step.weights),
            out: l.ptr_mut(&mut out.buf),
            tokens: step.tokens as u32,
            top_k: s.top_k as u32,
            hidden: s.hidden as u32,
            out_f32: (self.opts.output == OutType::F32) as u32,
        };
        // SAFETY: every slot ≥ 0 is a row of the rows read (the chunks' or the down GEMM's),
        // `tokens × hidden` outputs of the checked type.
        unsafe { go(l, p) }
    }

    pub(crate) fn last_step(&self) -> Option<MoeStep<'_>> {
        let s = self.step.as_ref()?;
        Some(MoeStep {
            chosen: s.chosen.slice(..),
            weights: s.weights.slice(..),
            slot: s.slot.slice(..),
            tokens: &s.xq,
            grouped: &s.a,
            groups: &s.groups,
            gate_up: &s.out1,
            hidden: &s.h,
            down: &s.out2,
        })
    }
}

fn shape_err(msg: String) -> Error {
    shape(msg)
}

/// The buffer of groups this layer made ([`Gpu::device_groups`]), for its kernels to write.
fn owned<'g>(groups: &'g mut DeviceGroups<'static>) -> Result<&'g mut CudaSlice<i32>> {
    match &mut groups.values {
        crate::grouped::GroupValues::Owned(v) => Ok(v),
        crate::grouped::GroupValues::View(_) => Err(Error::Config("groups over a view".into())),
    }
}

fn no_step() -> Error {
    Error::Config("no step has run".into())
}

/// A mixture-of-experts layer with all its experts on one GPU (module doc).
pub struct MoeLayer<'a> {
    local: Local<'a>,
}

impl std::fmt::Debug for MoeLayer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoeLayer")
            .field("shape", &self.local.shape)
            .field("opts", &self.local.opts)
            .finish()
    }
}

impl<'a> MoeLayer<'a> {
    /// A layer over `gpu`'s experts `w1` (`experts × 2·inter × hidden`, gate and up interleaved)
    /// and `w2` (`experts × hidden × inter`), DeepSeek FP8 weights. `Error::Shape` /
    /// `Error::Format` / `Error::WrongGpu` for weights or a shape the layer cannot take.
    pub fn new(
        gpu: &'a Gpu,
        shape: MoeShape,
        w1: &'a DeviceMatrix<'a>,
        w2: &'a DeviceMatrix<'a>,
        opts: MoeOptions,
    ) -> Result<Self> {
        Ok(MoeLayer {
            local: Local::new(gpu, shape, (w1, w2), opts, 1)?,
        })
    }

    /// One step: `x` (tokens × hidden, f32 / bf16 / fp16) routed by `logits` (tokens × experts,
    /// f32) through the experts into `out` (tokens × hidden, the options' type). Asynchronous on
    /// the GPU handle's stream; allocates only at the first step of each token count.
    pub fn forward(
        &mut self,
        x: &DeviceTensor,
        logits: &DeviceTensor,
        out: &mut DeviceOutput,
    ) -> Result<()> {
        self.local.dispatch(x, logits)?;
        self.local.experts()?;
        self.local.combine(out)
    }

    /// The last step's buffers ([`MoeStep`]); `None` before the first.
    pub fn last_step(&self) -> Option<MoeStep<'_>> {
        self.local.last_step()
    }
}
