//! Split-K on the host, shared by every family that splits K: the f32 workspace the GEMM writes
//! its partial sums into (grown on demand, reused in stream order) and the reduction launched
//! after it (`kernels::gemm::splitk`).

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, CudaStream};

use crate::error::{Result, shape};
use crate::format::OutType;
use crate::launch::Launch;
use crate::matrix::GemmShape;
use blockscaled_kernels::params::{SPLITK_THREADS, SplitKParams};
use blockscaled_kernels::registry;

/// The reduction kernel and the workspace of one GPU's family.
pub(crate) struct SplitK {
    reduce: CudaFunction,
    workspace: Mutex<Option<CudaSlice<f32>>>,
}

/// The workspace slot, held for the duration of one GEMM and its reduction.
pub(crate) type Workspace<'a> = MutexGuard<'a, Option<CudaSlice<f32>>>;

/// f32 values of the split-K workspace: `split_k` partial sums of every output element.
pub(crate) fn workspace_len(s: &GemmShape, split_k: u32) -> Result<usize> {
    [s.l, s.m, s.n]
        .iter()
        .try_fold(split_k as usize, |acc, &x| acc.checked_mul(x))
        .filter(|&len| len.checked_mul(4).is_some())
        .ok_or_else(|| shape("split-K workspace size overflows"))
}

/// The checks split-K adds to a family's configuration check.
pub(crate) fn validate(s: &GemmShape, split_k: u32) -> Result<()> {
    if split_k > 1 {
        workspace_len(s, split_k)?;
        if s.l > u16::MAX as usize {
            return Err(shape(format!(
                "split-K takes at most 65535 batch entries, not {}",
                s.l
            )));
        }
    }
    Ok(())
}

/// Where one GEMM launch writes, and whether a reduction follows it.
pub(crate) struct Destination {
    /// The GEMM's output: the f32 workspace when K is split, else C.
    pub(crate) gemm_out: u64,
    /// The GEMM's output type (f32 partials when K is split).
    pub(crate) out_type: OutType,
    /// C.
    out: u64,
    /// The split and C's type, when the reduction must follow.
    reduce: Option<(u32, OutType)>,
}

impl Destination {
    /// Whether the GEMM writes partial sums (and the reduction writes C).
    pub(crate) fn splits(&self) -> bool {
        self.reduce.is_some()
    }
}

impl SplitK {
    /// The workspace slot, locked when `split_k > 1`; held until the reduction is enqueued.
    pub(crate) fn slot(&self, split_k: u32) -> Option<Workspace<'_>> {
        (split_k > 1).then(|| self.lock())
    }

    /// Where the GEMM that `launch` will start writes: with a `slot`, `split_k` f32 partial sums
    /// into the workspace (grown for `shape`), else C (`out`, of `dtype`). `launch` holds the
    /// guards of both, so that no event is recorded between the GEMM and the reduction (it would
    /// keep the reduction from starting during the GEMM's tail).
    pub(crate) fn destination<'a>(
        launch: &mut Launch<'a>,
        slot: Option<&'a mut Workspace<'_>>,
        stream: &Arc<CudaStream>,
        shape: &GemmShape,
        split_k: u32,
        out: &'a mut CudaSlice<u8>,
        dtype: OutType,
    ) -> Result<Destination> {
        let ws = match slot {
            Some(slot) => Some(SplitK::workspace(slot, stream, shape, split_k)?),
            None => None,
        };
        let out = launch.ptr_mut(out);
        Ok(match ws {
            Some(w) => Destination {
                gemm_out: launch.ptr_mut(w),
                out_type: OutType::F32,
                out,
                reduce: Some((split_k, dtype)),
            },
            None => Destination {
                gemm_out: out,
                out_type: dtype,
                out,
                reduce: None,
            },
        })
    }

    /// After the GEMM's launch to `d`: the reduction into C when it split (at most `max_blocks`
    /// blocks; see [`SplitK::reduce`]).
    /// # Safety
    /// `d` came from [`SplitK::destination`] for the launch just enqueued on `stream`, whose
    /// guards (and the workspace slot) are still held; `(m, n, l)` is its output's shape, l ≤
    /// 65535 ([`validate`]).
    pub(crate) unsafe fn finish(
        &self,
        stream: &Arc<CudaStream>,
        d: &Destination,
        dims: (usize, usize, usize),
        max_blocks: u32,
    ) -> Result<()> {
        match d.reduce {
            // SAFETY: the caller's contract: the workspace holds split·l·m·n f32 written by the
            // GEMM, and C holds l·m·n values of `dtype`, both alive and ordered by its guards.
            Some((split, dtype)) => unsafe {
                self.reduce(stream, d.gemm_out, d.out, dims, split, dtype, max_blocks)
            },
            None => Ok(()),
        }
    }

    pub(crate) fn load(module: &Arc<CudaModule>) -> Result<Self> {
        Ok(SplitK {
            reduce: module.load_function(registry::SPLITK_REDUCE.name)?,
            workspace: Mutex::new(None),
        })
    }

    /// Locks the workspace slot (a poisoned lock still holds a usable buffer).
    fn lock(&self) -> Workspace<'_> {
        self.workspace.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The workspace for `shape` split `split_k` ways, grown if too small (replaced in stream
    /// order: earlier launches that use the old one are ordered before its free).
    fn workspace<'a>(
        slot: &'a mut Workspace<'_>,
        stream: &Arc<CudaStream>,
        shape: &GemmShape,
        split_k: u32,
    ) -> Result<&'a mut CudaSlice<f32>> {
        let need = workspace_len(shape, split_k)?;
        Ok(match slot.take() {
            Some(w) if w.len() >= need => slot.insert(w),
            _ => slot.insert(stream.alloc_zeros::<f32>(need)?),
        })
    }

    /// Launches the reduction of the `split` partial sums at `ws` into `out` (`l` × `m` × `n` of
    /// `dtype`) with programmatic dependent launch: it is scheduled while the GEMM's last CTAs
    /// finish (they signal `griddepcontrol.launch_dependents`) and waits for their writes with
    /// `griddepcontrol.wait`. `max_blocks`: at most this many blocks (they stride over the rest).
    /// # Safety
    /// `ws` holds `split · l · m · n` f32 written by the launch before this one on `stream`;
    /// `out` holds `l · m · n` values of `dtype`; both stay alive and ordered by that launch's
    /// guards until this one is enqueued; `l` ≤ 65535 ([`validate`]).
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce(
        &self,
        stream: &Arc<CudaStream>,
        ws: u64,
        out: u64,
        (m, n, l): (usize, usize, usize),
        split: u32,
        dtype: OutType,
        max_blocks: u32,
    ) -> Result<()> {
        let blocks = (m * n)
            .div_ceil(4 * SPLITK_THREADS as usize)
            .min(max_blocks as usize) as u32;
        let launch = Launch::new(stream, &self.reduce)
            .grid(blocks.max(1), l as u32, 1)
            .block(SPLITK_THREADS, 1, 1)
            .programmatic();
        let params = SplitKParams {
            ws,
            out,
            mn: (m * n) as u64,
            l: l as u32,
            split,
            out_type: dtype as u32,
            _pad: 0,
        };
        // SAFETY: the caller's contract; the grid covers m·n (x, strided) and l (y).
        let _reduce = unsafe { launch.launch(&params) }?;
        Ok(())
    }
}
