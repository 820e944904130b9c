//! One GPU's share of a MoE layer: its step buffers, and the phases the one-GPU and the
//! expert-parallel layers run (dispatch, regroup, experts, combine).

use cudarc::driver::CudaSlice;

use super::kernels::{a_role_ptr, go, has_a_role, no_step, not_owned, scale_rows};
use super::{MoeOptions, MoeShape, MoeStep};
use crate::buffers::{DeviceMatrix, DeviceOutput};
use crate::call::Call;
use crate::device::Gpu;
use crate::error::{Error, Result, shape};
use crate::format::{OutType, Recipe};
use crate::grouped::{DeviceGroups, GroupLayout};
use crate::launch::Launch;
use crate::quantizer::{DeviceTensor, QuantizeOptions};
use blockscaled_kernels::moe::{
    self as km, Combine, MAX_EXPERTS, MAX_TOP_K, MOE_THREADS, Offsets, Pack, Rank, Regroup,
    RegroupPlan, Route, ScaleRows, SwigluQuantize,
};
use blockscaled_kernels::quantize::InputType;

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

/// One GPU's share of a layer: its experts (the `world`-th part of them), the layer's shape, and the
/// step buffers.
pub(crate) struct Local<'a> {
    pub(crate) gpu: &'a Gpu,
    w1: &'a DeviceMatrix<'a>,
    w2: &'a DeviceMatrix<'a>,
    pub(super) shape: MoeShape,
    pub(super) opts: MoeOptions,
    world: usize,
    pub(crate) step: Option<Step>,
}

impl<'a> Local<'a> {
    /// Checks the shape, the options and this GPU's experts (`world` GPUs' share each).
    pub(crate) fn new(
        gpu: &'a Gpu,
        s: MoeShape,
        (w1, w2): (&'a DeviceMatrix<'a>, &'a DeviceMatrix<'a>),
        opts: MoeOptions,
        world: usize,
    ) -> Result<Self> {
        if s.hidden == 0
            || s.inter == 0
            || !s.hidden.is_multiple_of(128)
            || !s.inter.is_multiple_of(128)
        {
            return Err(shape(format!(
                "hidden {} and inter {} must be positive multiples of 128 (FP8 scales per 1×128)",
                s.hidden, s.inter
            )));
        }
        if s.experts == 0 || s.experts > MAX_EXPERTS as usize || !s.experts.is_multiple_of(world) {
            return Err(shape(format!(
                "{} experts: 1 to {MAX_EXPERTS}, a multiple of the {world} GPUs",
                s.experts
            )));
        }
        if s.top_k == 0 || s.top_k > (MAX_TOP_K as usize).min(s.experts) {
            return Err(shape(format!(
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
                return Err(shape(format!(
                    "{name} is {}×{}×{}, this GPU's {local} experts need {local}×{rows}×{k}",
                    d.batch, d.rows, d.k
                )));
            }
        }
        Ok(Local {
            gpu,
            w1,
            w2,
            shape: s,
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
            return Err(shape(format!(
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
            return Err(shape(format!(
                "the tokens are {}×{}×{}: tokens × hidden ({}), batch 1",
                x.batch, x.rows, x.k, s.hidden
            )));
        }
        if (logits.rows, logits.k, logits.batch) != (tokens, s.experts, 1) {
            return Err(shape(format!(
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
        // (The groups this layer made: a buffer of its own, written here.)
        let mut values = if one {
            Some(step.groups.values_mut().ok_or_else(not_owned)?)
        } else {
            None
        };
        let mut l = Launch::new(st, &k.offsets)
            .block(threads, 1, 1)
            .shared_mem(128 + 4 * s.experts as u32);
        let groups = match values.as_mut() {
            Some(v) => l.ptr_mut(v),
            None => 0,
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
            let mut values = step.groups.values_mut().ok_or_else(not_owned)?;
            let mut l = Launch::new(st, &k.regroup_plan)
                .block(pairs.next_multiple_of(32), 1, 1)
                .shared_mem(128 + 8 * pairs);
            let p = RegroupPlan {
                sent: l.ptr(&c.recv_sent),
                src_start: l.ptr_mut(&mut c.src_start),
                dst_start: l.ptr_mut(&mut c.dst_start),
                groups: l.ptr_mut(&mut values),
                world: world as u32,
                per_peer: local as u32,
                group_capacity: gcap,
                pad: 0,
            };
            // SAFETY: `world · local` counts and starts, `local` groups; one block of a thread
            // per pair with its shared words.
            unsafe { go(l, p) }?;
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
        let call = Call::new(&step.a, self.w1).groups(&step.groups);
        g.run(
            &plans.map_or(call, |(p1, _)| call.with_plan(p1)),
            &mut step.out1,
        )?;
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
        let call = Call::new(&step.h, self.w2).groups(&step.groups);
        g.run(
            &plans.map_or(call, |(_, p2)| call.with_plan(p2)),
            &mut step.out2,
        )
    }

    /// Each token's weighted sum of its entries' rows into `out`: the rows the experts returned
    /// (expert parallelism) or the down GEMM's own.
    pub(crate) fn combine(&mut self, out: &mut DeviceOutput) -> Result<()> {
        let (g, s) = (self.gpu, self.shape);
        let step = self.step.as_ref().ok_or_else(no_step)?;
        g.id().check(out.gpu, "the output")?;
        if (out.m, out.n, out.l, out.dtype) != (step.tokens, s.hidden, 1, self.opts.output) {
            return Err(shape(format!(
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
