//! [`Workspace`]: the memory a GEMM uses beside its operands and output (split K's partial sums
//! and counters, the fold pre-pass's FP8 copies, a fused epilogue's staged rows), grown on
//! demand and then reused in the order of the stream of the calls that use it. Every
//! [`Gpu`](crate::Gpu) handle has its own; a call may bring another
//! ([`Call::workspace`](crate::Call::workspace)), sized before it runs
//! ([`Gpu::workspace_size`](crate::Gpu::workspace_size), [`Gpu::reserve`](crate::Gpu::reserve)),
//! as cuBLASLt's workspace is. Calls on different streams with different workspaces never wait
//! on each other's locks or memory.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream};

use crate::alloc::{grown, lock};
use crate::buffers::GpuId;
use crate::error::{Result, shape};
use crate::held::Held;
use crate::splitk::SplitK;
use blockscaled_kernels::gemm::scheduler::{ClusterShape, Schedule};

/// Memory a GEMM call uses beside its operands and output (the module doc). Made empty; grown by
/// the calls that run in it ([`Gpu::reserve`](crate::Gpu::reserve) grows it ahead). Used by one
/// GPU (the first that uses it: [`Error::WrongGpu`](crate::Error::WrongGpu) for another), in the
/// order of the stream of the handle whose call uses it: a workspace shared by calls on two
/// streams that run at once would mix their partial sums, so take one per stream.
#[derive(Default)]
pub struct Workspace {
    pub(crate) splitk: SplitK,
    /// The fold pre-pass's copies of A and B (the fold family's type, which it alone reads).
    pub(crate) fold: Mutex<[Option<Box<dyn Held>>; 2]>,
    /// The rows a fused epilogue stages in global memory where the kernel's shared memory has no
    /// room for them (the MX kernel).
    pub(crate) staging: Mutex<Option<CudaSlice<u8>>>,
    /// The GPU whose memory it holds, set at its first use.
    gpu: OnceLock<GpuId>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Workspace({} bytes)", self.bytes())
    }
}

impl Workspace {
    /// An empty workspace: no memory until a call or [`Gpu::reserve`](crate::Gpu::reserve) grows
    /// it.
    pub fn new() -> Workspace {
        Workspace::default()
    }

    /// The device memory it holds now, in bytes.
    pub fn bytes(&self) -> usize {
        let staging = lock(&self.staging).as_ref().map_or(0, |s| s.len());
        let fold = lock(&self.fold)
            .iter()
            .flatten()
            .map(|f| f.device_bytes())
            .sum::<usize>();
        self.splitk.bytes() + staging + fold
    }

    /// Binds the workspace to `gpu` at its first use; [`Error::WrongGpu`](crate::Error::WrongGpu)
    /// for another.
    pub(crate) fn bind(&self, gpu: GpuId) -> Result<()> {
        gpu.check(*self.gpu.get_or_init(|| gpu), "the workspace")
    }

    /// Grows split K's buffers and the staging to at least `need`'s (the fold copies are the fold
    /// family's: [`crate::families::fold`]).
    pub(crate) fn reserve(&self, stream: &Arc<CudaStream>, need: &WorkspaceSize) -> Result<()> {
        if need.split_k > 0 {
            self.splitk.reserve(stream, need.partials, need.counters)?;
        }
        if need.staging > 0 {
            grown(&mut lock(&self.staging), stream, need.staging as u64)?;
        }
        Ok(())
    }
}

/// The workspace one call needs, in bytes by kind ([`Gpu::workspace_size`](crate::Gpu::workspace_size)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkspaceSize {
    /// Split K's f32 partial sums and u32 arrival counters.
    pub split_k: usize,
    /// The fold pre-pass's FP8 copies of A and B (MX / NVFP4 operands on the FP8 kernel),
    /// tensor maps included.
    pub fold: usize,
    /// A fused epilogue's rows staged in global memory (the MX kernel).
    pub staging: usize,
    /// (Split K's partial sums and counters, as elements.)
    pub(crate) partials: u64,
    pub(crate) counters: u64,
}

impl WorkspaceSize {
    /// All of it.
    pub fn total(&self) -> usize {
        self.split_k + self.fold + self.staging
    }

    /// Split K's workspace for `schedule` in clusters of `cluster`: f32 partial sums and u32
    /// counters where the launch splits K (`split`), else none.
    pub(crate) fn split_k(
        schedule: &Schedule,
        cluster: ClusterShape,
        split: bool,
    ) -> Result<WorkspaceSize> {
        if !split {
            return Ok(WorkspaceSize::default());
        }
        let (floats, counters) = crate::splitk::sizes(schedule, cluster)?;
        WorkspaceSize::split(floats, counters)
    }

    /// Split K's `floats` partial sums and `counters` counters.
    pub(crate) fn split(floats: u64, counters: u64) -> Result<WorkspaceSize> {
        let bytes = floats
            .checked_add(counters)
            .and_then(|x| x.checked_mul(4))
            .and_then(|x| usize::try_from(x).ok())
            .ok_or_else(|| shape("split-K workspace size overflows"))?;
        Ok(WorkspaceSize {
            split_k: bytes,
            partials: floats,
            counters,
            ..WorkspaceSize::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_k_sizes_add_up_and_overflow_is_an_error() {
        let w = WorkspaceSize::split(1000, 24).unwrap();
        assert_eq!((w.split_k, w.total()), (4096, 4096));
        assert_eq!((w.partials, w.counters), (1000, 24));
        assert!(WorkspaceSize::split(u64::MAX / 4, 1).is_err());
        assert!(WorkspaceSize::split(u64::MAX, 0).is_err());
        assert_eq!(Workspace::new().bytes(), 0, "a new workspace holds nothing");
    }
}
