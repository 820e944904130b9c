//! Several GPUs of one process joined by NCCL (feature `nccl`): a [`Gpu`] handle and an NCCL
//! communicator per GPU, both on the handle's stream, and the collective a tensor-parallel layer
//! needs on this crate's outputs ([`Ranks::all_reduce_sum`]: a row-split GEMM's partial
//! products summed on every rank). NCCL is loaded at run time, as the driver is, so the feature
//! builds without it; `Ranks::new` reports a missing library as [`Error::Collective`]. cudarc
//! looks for `libnccl.so` (or `libnccl.so.13`, …): NVIDIA's pip package `nvidia-nccl-cu13` ships
//! `libnccl.so.2`, which needs a link of that name on the library path (`scripts/run-gpu.sh`
//! makes one). Keep NVLink multicast off (`NCCL_NVLS_ENABLE=0`) on shared machines.
//!
//! A column split needs no collective: each rank multiplies its share of the weights' rows and
//! keeps its share of the output's columns (the next, row-split, layer's input). A row split
//! multiplies each rank's share of K and sums the products: run each rank's GEMM into an output
//! of the full shape, then [`Ranks::all_reduce_sum`]. Expert parallelism moves tokens among the
//! ranks: [`Ranks::all_to_all`] exchanges chunks of a fixed capacity per peer.

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtrMut, DeviceSlice, SyncOnDrop, sys,
};
use cudarc::nccl::{Comm, NcclType, ReduceOp};
use half::{bf16, f16};
use std::marker::PhantomData;
use std::sync::Arc;

use crate::buffers::{DeviceMatrix, DeviceOutput, Mem};
use crate::device::Gpu;
use crate::error::{Error, Result, shape};
use crate::format::OutType;
use crate::moe::{Local, MoeOptions, MoeShape, MoeStep};
use crate::quantizer::DeviceTensor;

/// The GPUs of one process, one rank each (the module doc). Driven from one thread: its calls
/// enqueue every rank's work, grouped as NCCL requires, on each rank's stream.
pub struct Ranks {
    gpus: Vec<Gpu>,
    comms: Vec<Comm>,
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.gpus).finish()
    }
}

fn collective(e: cudarc::nccl::result::NcclError) -> Error {
    Error::Collective(format!("{e:?}"))
}

impl Ranks {
    /// A rank on each GPU of `ordinals` (distinct), with a handle of its own stream.
    pub fn new(ordinals: &[usize]) -> Result<Ranks> {
        let gpus = ordinals
            .iter()
            .map(|&o| Gpu::new(o))
            .collect::<Result<Vec<_>>>()?;
        Ranks::from_gpus(gpus)
    }

    /// A rank on each of `gpus` (handles of distinct GPUs; their streams carry the collectives).
    pub fn from_gpus(gpus: Vec<Gpu>) -> Result<Ranks> {
        let mut seen: Vec<usize> = gpus.iter().map(|g| g.context().ordinal()).collect();
        seen.sort_unstable();
        if seen.is_empty() || seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::Config(format!(
                "ranks need one handle each of distinct GPUs, not GPUs {seen:?}"
            )));
        }
        // (NCCL's absence is an error here, not a panic in a later call.)
        let names = cudarc::get_lib_name_candidates("nccl");
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        crate::device::library_present(&names, "NCCL").map_err(Error::Collective)?;
        let streams = gpus.iter().map(|g| g.stream().clone()).collect();
        let comms = Comm::from_devices(streams).map_err(collective)?;
        Ok(Ranks { gpus, comms })
    }

    /// The number of ranks.
    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Whether there are none (never: [`Ranks::new`] refuses an empty list).
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    /// Rank `r`'s handle.
    pub fn gpu(&self, r: usize) -> &Gpu {
        &self.gpus[r]
    }

    /// Every rank's handle, by rank.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// Sums the ranks' outputs in place (`outs[r]` rank r's, all of one shape and type): each ends
    /// holding the sum, in its type (bf16 and fp16 sums are NCCL's, rounded once a step; f32 for
    /// the sum of partial products of a row split). Enqueued on each rank's stream after the work
    /// already there (the GEMMs that wrote them); no host wait.
    pub fn all_reduce_sum(&self, outs: &mut [&mut DeviceOutput<'_>]) -> Result<()> {
        if outs.len() != self.len() {
            return Err(shape(format!(
                "{} outputs for {} ranks",
                outs.len(),
                self.len()
            )));
        }
        let first = (outs[0].l, outs[0].m, outs[0].n, outs[0].dtype);
        for (r, (c, gpu)) in outs.iter().zip(&self.gpus).enumerate() {
            gpu.id().check(c.gpu, &format!("rank {r}'s output"))?;
            if (c.l, c.m, c.n, c.dtype) != first {
                return Err(shape(format!(
                    "rank {r}'s output is {}×{}×{} {:?}, rank 0's {}×{}×{} {:?}",
                    c.l, c.m, c.n, c.dtype, first.0, first.1, first.2, first.3
                )));
            }
            if !c.buf.writable() {
                return Err(Error::Config(format!("rank {r}'s output is read-only")));
            }
        }
        // (One thread issues every rank's call between group_start and group_end, as NCCL
        // requires of a thread that drives several communicators.)
        cudarc::nccl::result::group_start().map_err(collective)?;
        let issued = outs
            .iter_mut()
            .zip(&self.comms)
            .try_for_each(|(c, comm)| match c.dtype {
                OutType::Bf16 => sum::<bf16>(comm, &mut c.buf),
                OutType::F16 => sum::<f16>(comm, &mut c.buf),
                _ => sum::<f32>(comm, &mut c.buf),
            });
        let ended = cudarc::nccl::result::group_end().map_err(collective);
        issued.and(ended.map(drop))
    }

    /// Exchanges equal chunks among the ranks (NCCL's all-to-all, as grouped sends and
    /// receives): `send[r]` and `recv[r]` are rank r's buffers of `len()` chunks of the same
    /// bytes each, and chunk p of `send[r]` lands as chunk r of `recv[p]`. An expert-parallel
    /// layer's dispatch and combine with buffers of a fixed capacity per peer (codes, scales and
    /// counts in buffers of their own, each exchanged this way), so that no host wait on the
    /// routing's counts sits between them. Enqueued on each rank's stream; no host wait.
    pub fn all_to_all(
        &self,
        send: &[CudaView<'_, u8>],
        recv: &mut [CudaViewMut<'_, u8>],
    ) -> Result<()> {
        self.all_to_all_sets(&mut [(send, recv)])
    }

    /// Several [`Ranks::all_to_all`]s (each set: every rank's send and receive buffers) in one
    /// NCCL group: one launch per rank and peer for all of them.
    pub(crate) fn all_to_all_sets(&self, sets: &mut [Exchange<'_, '_, '_>]) -> Result<()> {
        let world = self.len();
        for (send, recv) in sets.iter() {
            self.check_exchange(send, recv)?;
        }
        cudarc::nccl::result::group_start().map_err(collective)?;
        let issued = (|| -> Result<()> {
            for (send, recv) in sets.iter_mut() {
                let chunk = send[0].len() / world;
                for (r, comm) in self.comms.iter().enumerate() {
                    for p in 0..world {
                        let part = p * chunk..(p + 1) * chunk;
                        comm.send(&send[r].slice(part.clone()), p as i32)
                            .map_err(collective)?;
                        comm.recv(&mut recv[r].slice_mut(part), p as i32)
                            .map_err(collective)?;
                    }
                }
            }
            Ok(())
        })();
        let ended = cudarc::nccl::result::group_end().map_err(collective);
        issued.and(ended.map(drop))
    }

    /// `Error::Shape` / `Error::WrongGpu` unless every rank sends and receives the same bytes,
    /// a positive multiple of the ranks, on its own GPU.
    fn check_exchange(
        &self,
        send: &[CudaView<'_, u8>],
        recv: &[CudaViewMut<'_, u8>],
    ) -> Result<()> {
        let world = self.len();
        if send.len() != world || recv.len() != world {
            return Err(shape(format!(
                "{} send and {} receive buffers for {world} ranks",
                send.len(),
                recv.len()
            )));
        }
        let bytes = send[0].len();
        if bytes == 0 || bytes % world != 0 {
            return Err(shape(format!(
                "rank 0 sends {bytes} bytes: a positive multiple of {world} chunks"
            )));
        }
        for (r, ((s, d), gpu)) in send.iter().zip(recv.iter()).zip(&self.gpus).enumerate() {
            if s.len() != bytes || d.len() != bytes {
                return Err(shape(format!(
                    "rank {r} sends {} and receives {} bytes, rank 0 sends {bytes}",
                    s.len(),
                    d.len()
                )));
            }
            gpu.same_context(s.stream().context(), &format!("rank {r}'s send buffer"))?;
            gpu.same_context(d.stream().context(), &format!("rank {r}'s receive buffer"))?;
        }
        Ok(())
    }
}

/// One all-to-all's buffers: every rank's send buffer and receive buffer.
pub(crate) type Exchange<'s, 'a, 'b> = (&'s [CudaView<'a, u8>], &'s mut [CudaViewMut<'b, u8>]);

/// Rank `comm`'s all-reduce (sum) of `buf` as elements of `T`, in place.
fn sum<T: NcclType>(comm: &Comm, buf: &mut Mem<'_>) -> Result<()> {
    let mut typed = Typed::<T> {
        mem: buf,
        _t: PhantomData,
    };
    comm.all_reduce_in_place(&mut typed, &ReduceOp::Sum)
        .map(drop)
        .map_err(collective)
}

/// A byte buffer seen as elements of `T` (an output's, whose type its `OutType` says).
struct Typed<'m, 'a, T> {
    mem: &'m mut Mem<'a>,
    _t: PhantomData<T>,
}

impl<T> DeviceSlice<T> for Typed<'_, '_, T> {
    fn len(&self) -> usize {
        self.mem.len() / std::mem::size_of::<T>()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.mem.stream()
    }
}

impl<T> DevicePtrMut<T> for Typed<'_, '_, T> {
    fn device_ptr_mut<'b>(
        &'b mut self,
        stream: &'b CudaStream,
    ) -> (sys::CUdeviceptr, SyncOnDrop<'b>) {
        // (Writable: `all_reduce_sum` checked.)
        self.mem.device_ptr_mut(stream)
    }
}

/// A mixture-of-experts layer split over the ranks by experts (the `moe` module's doc): rank r
/// holds experts `r·E/W .. (r+1)·E/W` and its own tokens. A step routes each rank's tokens,
/// sends each peer the rows of its experts (codes, scales and counts, in chunks of a fixed
/// capacity: no host wait on the counts), runs the peers' grouped GEMMs on what they received,
/// sends the output rows back and sums each token's. Every rank's work is enqueued from one
/// thread, on its handle's stream.
pub struct ExpertParallel<'a> {
    ranks: &'a Ranks,
    locals: Vec<Local<'a>>,
}

impl std::fmt::Debug for ExpertParallel<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertParallel")
            .field("ranks", &self.ranks.len())
            .finish()
    }
}

impl<'a> ExpertParallel<'a> {
    /// A layer over `ranks`, rank r holding `experts[r]`: its `E/W` experts' `w1` (`E/W × 2·inter
    /// × hidden`, gate and up interleaved) and `w2` (`E/W × hidden × inter`), DeepSeek FP8
    /// weights on its GPU.
    pub fn new(
        ranks: &'a Ranks,
        dims: MoeShape,
        experts: &[(&'a DeviceMatrix<'a>, &'a DeviceMatrix<'a>)],
        opts: MoeOptions,
    ) -> Result<Self> {
        let world = ranks.len();
        if experts.len() != world {
            return Err(shape(format!(
                "{} ranks' experts for {world} ranks",
                experts.len()
            )));
        }
        let locals = experts
            .iter()
            .zip(ranks.gpus())
            .map(|(&w, gpu)| Local::new(gpu, dims, w, opts, world))
            .collect::<Result<_>>()?;
        Ok(ExpertParallel { ranks, locals })
    }

    /// One step: rank r's tokens `xs[r]` (the same count on every rank) routed by `logits[r]`
    /// into `outs[r]`; [`Self::dispatch`], [`Self::send_tokens`], [`Self::compute`],
    /// [`Self::send_rows`] and [`Self::combine`] in turn.
    pub fn forward(
        &mut self,
        xs: &[&DeviceTensor],
        logits: &[&DeviceTensor],
        outs: &mut [&mut DeviceOutput<'_>],
    ) -> Result<()> {
        self.dispatch(xs, logits)?;
        self.send_tokens()?;
        self.compute()?;
        self.send_rows()?;
        self.combine(outs)
    }

    /// Each rank quantizes and routes its tokens and packs the peers' chunks.
    pub fn dispatch(&mut self, xs: &[&DeviceTensor], logits: &[&DeviceTensor]) -> Result<()> {
        let world = self.locals.len();
        if xs.len() != world || logits.len() != world {
            return Err(shape(format!(
                "{} token and {} logit tensors for {world} ranks",
                xs.len(),
                logits.len()
            )));
        }
        if xs.iter().any(|x| x.rows != xs[0].rows) {
            return Err(shape(
                "every rank steps the same number of tokens (the chunks' sizes agree)",
            ));
        }
        for ((local, x), l) in self.locals.iter_mut().zip(xs).zip(logits) {
            local.dispatch(x, l)?;
        }
        Ok(())
    }

    /// The all-to-all of the tokens' chunks: codes, scales and each expert's row count.
    pub fn send_tokens(&mut self) -> Result<()> {
        self.exchange(|sent, c| {
            vec![
                (c.send.slice(..), c.recv.slice_mut(..)),
                (c.send_scales.slice(..), c.recv_scales.slice_mut(..)),
                (sent.slice(..), c.recv_sent.slice_mut(..)),
            ]
        })
    }

    /// Each rank's experts on the rows it received: regrouped, the two grouped GEMMs, the output
    /// rows put back in their chunks.
    pub fn compute(&mut self) -> Result<()> {
        for local in &mut self.locals {
            local.regroup(true)?;
            local.experts()?;
            local.regroup(false)?;
        }
        Ok(())
    }

    /// The all-to-all of the experts' output rows, back to the tokens' ranks.
    pub fn send_rows(&mut self) -> Result<()> {
        self.exchange(|_, c| vec![(c.back_send.slice(..), c.back_recv.slice_mut(..))])
    }

    /// Each rank's weighted sums into `outs[r]`.
    pub fn combine(&mut self, outs: &mut [&mut DeviceOutput<'_>]) -> Result<()> {
        if outs.len() != self.locals.len() {
            return Err(shape(format!(
                "{} outputs for {} ranks",
                outs.len(),
                self.locals.len()
            )));
        }
        for (local, out) in self.locals.iter_mut().zip(outs.iter_mut()) {
            local.combine(out)?;
        }
        Ok(())
    }

    /// Rank `r`'s last step ([`MoeStep`]; its slots index the chunks).
    pub fn last_step(&self, r: usize) -> Option<MoeStep<'_>> {
        self.locals.get(r)?.last_step()
    }

    /// An all-to-all of each pair of buffers `pick` gives per rank (send, receive), all in one
    /// NCCL group.
    fn exchange<'s>(
        &'s mut self,
        pick: impl Fn(
            &'s CudaSlice<u8>,
            &'s mut crate::moe::Chunks,
        ) -> Vec<(CudaView<'s, u8>, CudaViewMut<'s, u8>)>,
    ) -> Result<()> {
        let mut per_rank = Vec::new();
        for local in &mut self.locals {
            let not_yet = || Error::Config("send before dispatch: no step has run".into());
            let step = local.step.as_mut().ok_or_else(not_yet)?;
            // (Every step of a layer of several ranks has its chunks.)
            let chunks = step.chunks.as_mut().ok_or_else(not_yet)?;
            per_rank.push(pick(&step.sent, chunks));
        }
        let buffers = per_rank.first().map_or(0, Vec::len);
        let mut columns: Vec<(Vec<_>, Vec<_>)> = (0..buffers).map(|_| (vec![], vec![])).collect();
        for pairs in per_rank {
            for (i, (s, r)) in pairs.into_iter().enumerate() {
                columns[i].0.push(s);
                columns[i].1.push(r);
            }
        }
        let mut sets: Vec<_> = columns
            .iter_mut()
            .map(|(s, r)| (s.as_slice(), r.as_mut_slice()))
            .collect();
        self.ranks.all_to_all_sets(&mut sets)
    }
}
