//! Split-K on the host, shared by every family that splits K: the workspace where a tile's K
//! ranges meet (`kernels::gemm::splitk`: f32 partial sums and u32 arrival counters, grown on
//! demand, reused in stream order). The GEMM itself writes C: the last CTA of each tile to finish
//! its range adds the partials.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, CudaStream};

use crate::alloc::grown;
use crate::error::{Result, shape};
use crate::launch::Launch;
use crate::matrix::GemmShape;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, Schedule};
use blockscaled_kernels::params::SplitKParams;

/// The workspace of one GPU's family.
#[derive(Default)]
pub(crate) struct SplitK {
    workspace: Mutex<Buffers>,
}

/// The workspace's two buffers, each grown on its own: the counters must be zero where a launch
/// finds them, which the counters of earlier launches are (each launch leaves its counters at
/// zero) but the partial sums' memory is not, so the two never share memory.
#[derive(Default)]
pub(crate) struct Buffers {
    counters: Option<CudaSlice<u32>>,
    partials: Option<CudaSlice<f32>>,
}

/// The workspace slot, held while one GEMM is enqueued.
pub(crate) type Workspace<'a> = MutexGuard<'a, Buffers>;

/// The checks split-K adds to a family's configuration check: the workspace's size fits.
pub(crate) fn validate(s: &GemmShape, split_k: u32) -> Result<()> {
    if split_k > 1 {
        [s.l, s.m, s.n]
            .iter()
            .try_fold(split_k as usize, |acc, &x| acc.checked_mul(x))
            .and_then(|len| len.checked_mul(8))
            .ok_or_else(|| shape("split-K workspace size overflows"))?;
    }
    Ok(())
}

/// [`Error::Config`](crate::Error::Config) unless `split_k` ranges split K's `k_blocks` blocks
/// of `block_k`: 1 to `k_blocks` ranges, and `split_k · k_blocks` below 2³², since every kernel's
/// scheduler computes the ranges `s·k_blocks / split` in 32 bits (past that it would skip some K
/// blocks and repeat others: a wrong C with no error).
pub(crate) fn check_split(split_k: u32, k_blocks: usize, block_k: u32, k: usize) -> Result<()> {
    if !(1..=k_blocks).contains(&(split_k as usize))
        || split_k as u64 * k_blocks as u64 > u32::MAX as u64
    {
        return Err(crate::error::config(format!(
            "split_k = {split_k}: K = {k} has {k_blocks} blocks of {block_k} to split, and split × \
             blocks must stay below 2³²"
        )));
    }
    Ok(())
}

/// (partial sums, counters) of `schedule`'s workspace in clusters of `cluster`.
pub(crate) fn sizes(schedule: &Schedule, cluster: ClusterShape) -> Result<(u64, u64)> {
    schedule
        .splitk_workspace(cluster)
        .filter(|&(f, c)| f.checked_add(c).and_then(|x| x.checked_mul(4)).is_some())
        .ok_or_else(|| shape("split-K workspace size overflows"))
}

impl SplitK {
    /// Grows the buffers to at least `floats` partial sums and `counters` counters.
    pub(crate) fn reserve(
        &self,
        stream: &Arc<CudaStream>,
        floats: u64,
        counters: u64,
    ) -> Result<()> {
        let mut b = crate::alloc::lock(&self.workspace);
        let Buffers {
            counters: c,
            partials: p,
        } = &mut *b;
        grown(c, stream, counters)?;
        grown(p, stream, floats)?;
        Ok(())
    }

    /// The device bytes the buffers hold.
    pub(crate) fn bytes(&self) -> usize {
        let b = crate::alloc::lock(&self.workspace);
        b.counters.as_ref().map_or(0, |c| c.len() * 4)
            + b.partials.as_ref().map_or(0, |p| p.len() * 4)
    }

    /// The workspace slot, locked when `split_k > 1`; held until the GEMM is enqueued.
    pub(crate) fn slot(&self, split_k: u32) -> Option<Workspace<'_>> {
        (split_k > 1).then(|| crate::alloc::lock(&self.workspace))
    }

    /// The GEMM's split-K parameters: with a `slot` (K split), the workspace grown for
    /// `schedule` in clusters of `cluster`, its guards held by `launch`; else zeros.
    pub(crate) fn params<'a>(
        launch: &mut Launch<'a>,
        slot: Option<&'a mut Workspace<'_>>,
        stream: &Arc<CudaStream>,
        schedule: &Schedule,
        cluster: ClusterShape,
    ) -> Result<SplitKParams> {
        if slot.is_none() {
            return Ok(SplitKParams::default());
        }
        Self::params_sized(launch, slot, stream, sizes(schedule, cluster)?)
    }

    /// [`Self::params`] for a kernel that sizes its own workspace: `floats` partial sums and
    /// `counters` counters.
    pub(crate) fn params_sized<'a>(
        launch: &mut Launch<'a>,
        slot: Option<&'a mut Workspace<'_>>,
        stream: &Arc<CudaStream>,
        (floats, counters): (u64, u64),
    ) -> Result<SplitKParams> {
        let Some(slot) = slot else {
            return Ok(SplitKParams::default());
        };
        // Zeroed when made; every launch leaves its counters at zero again (the last CTA of each
        // tile resets its counter), so a reused buffer needs no clearing.
        let Buffers {
            counters: c,
            partials: p,
        } = &mut **slot;
        let counters = launch.ptr_mut(grown(c, stream, counters)?);
        let ws = launch.ptr_mut(grown(p, stream, floats)?);
        Ok(SplitKParams { ws, counters })
    }
}
