//! What every persistent GEMM launch does, written once for every family: a loaded kernel with
//! the CTAs that can be resident at once (alone and in each cluster size), the configuration
//! rules a persistent schedule obeys, and the launch's shared steps (grid of whole clusters with no
//! second wave, the groups' values and split-K's workspace bound to the launch). A family adds
//! its operands and its parameter struct.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaStream};

use crate::error::{Error, Result, config, shape};
use crate::grouped::DeviceGroups;
use crate::launch::Launch;
use crate::matrix::GemmShape;
use crate::splitk::{self, SplitK};
use blockscaled_kernels::gemm::scheduler::{ClusterShape, MAX_CLUSTER, Schedule};
use blockscaled_kernels::kernel_info::KernelInfo;
use blockscaled_kernels::params::{GroupParams, SplitKParams};
use blockscaled_kernels::sm90::Sm90Fp8Kernel;
use blockscaled_kernels::sm90_half::Sm90HalfKernel;
use blockscaled_kernels::sm90_mx::Sm90MxKernel;
use blockscaled_kernels::sm90_w4::Sm90W4Kernel;

/// A row of a family's kernel list, as the host loads it: its registry entry, threads per CTA
/// and dynamic shared memory.
pub(crate) trait KernelRow: PartialEq + Sync + 'static {
    fn info(&self) -> &KernelInfo;
    fn launch_shape(&self) -> (u32, u32);
}

/// [`KernelRow`] for the kernel crate's row types, which share the field and method names.
macro_rules! kernel_rows {
    ($($t:ty),+) => {$(
        impl KernelRow for $t {
            fn info(&self) -> &KernelInfo {
                &self.info
            }
            fn launch_shape(&self) -> (u32, u32) {
                (self.tile.threads(), self.layout().bytes())
            }
        }
    )+};
}
kernel_rows!(Sm90Fp8Kernel, Sm90MxKernel, Sm90W4Kernel, Sm90HalfKernel);

/// What loading a family on one GPU takes: the module built for its architecture (`target`,
/// as the registry names it), a stream of the GPU, its SMs, and the device preparers (for the
/// families that make weight-role copies at a matrix's first use as weights).
pub(crate) struct Loader<'a> {
    pub(crate) module: &'a Arc<CudaModule>,
    pub(crate) stream: &'a Arc<CudaStream>,
    pub(crate) target: &'static str,
    pub(crate) sm_count: u32,
    pub(crate) preparers: &'a crate::prepare::Preparers,
}

impl Loader<'_> {
    /// Whether the module has the kernels of a list whose first row is `first`.
    pub(crate) fn has<D: KernelRow>(&self, first: &D) -> bool {
        first.info().targets.contains(&self.target)
    }

    /// Every kernel of `rows` ([`Kernel::load`]), or `None` where the module has none of the
    /// list (the family is not on this GPU).
    pub(crate) fn kernels<D: KernelRow>(
        &self,
        rows: &'static [D],
        clustered: bool,
    ) -> Result<Option<Vec<Kernel<D>>>> {
        self.kernels_of(rows.iter(), clustered)
    }

    /// [`Self::kernels`] of rows from several lists.
    pub(crate) fn kernels_of<D: KernelRow>(
        &self,
        rows: impl IntoIterator<Item = &'static D>,
        clustered: bool,
    ) -> Result<Option<Vec<Kernel<D>>>> {
        let mut rows = rows.into_iter().peekable();
        if !rows.peek().is_some_and(|r| self.has(*r)) {
            return Ok(None);
        }
        rows.map(|def| {
            let (name, shape) = (def.info().name, def.launch_shape());
            Kernel::load(
                self.module,
                self.stream,
                (def, name),
                shape,
                self.sm_count,
                clustered,
            )
        })
        .collect::<Result<_>>()
        .map(Some)
    }
}

/// One loaded persistent kernel: its row of the family's kernel list (`def`), its function,
/// threads per CTA and dynamic shared memory, and how many of its CTAs can be resident at once
/// for each cluster size (index: cluster − 1). Clusters must fit in one GPC, so fewer pairs than
/// SMs / 2 may fit; a persistent grid larger than that would run its last clusters as a second
/// wave, so a launch never asks for more.
pub(crate) struct Kernel<D: 'static> {
    pub(crate) def: &'static D,
    func: CudaFunction,
    threads: u32,
    smem: u32,
    resident: [u32; MAX_CLUSTER as usize],
}

impl<D: 'static> Kernel<D> {
    /// Loads kernel `name` (the row `def`) from `module` with `threads` per CTA and `smem` bytes
    /// of dynamic shared memory (its limit raised above the default 48 KiB), measuring how many
    /// clusters of each size fit where the kernel runs in clusters (`clustered`); one CTA per SM
    /// otherwise (the stages fill an SM's shared memory).
    pub(crate) fn load(
        module: &Arc<CudaModule>,
        stream: &CudaStream,
        (def, name): (&'static D, &str),
        (threads, smem): (u32, u32),
        sm_count: u32,
        clustered: bool,
    ) -> Result<Self> {
        let func = crate::launch::load_kernel(module, name, smem)?;
        let mut resident = [sm_count; MAX_CLUSTER as usize];
        if clustered {
            for cluster in 2..=MAX_CLUSTER {
                let clusters = Launch::persistent(
                    stream,
                    &func,
                    sm_count / cluster * cluster,
                    threads,
                    smem,
                    cluster,
                )
                .max_active_clusters()?;
                resident[cluster as usize - 1] = clusters.saturating_mul(cluster).min(sm_count);
            }
        }
        Ok(Kernel {
            def,
            func,
            threads,
            smem,
            resident,
        })
    }

    /// CTAs resident at once in clusters of `cluster` CTAs.
    pub(crate) fn resident(&self, cluster: u32) -> u32 {
        self.resident[(cluster.clamp(1, MAX_CLUSTER) - 1) as usize]
    }

    /// The shared steps of a launch of `schedule` in clusters of `cluster`: at most `wanted`
    /// CTAs ([`persistent_ctas`]), the groups' values (`groups`) and split-K's workspace (`slot`,
    /// held where K is split) bound to the launch, whose guards keep them ordered on `stream`;
    /// the launch, and the parameters they give.
    pub(crate) fn persistent<'a>(
        &'a self,
        stream: &'a Arc<CudaStream>,
        schedule: &Schedule,
        (wanted, cluster): (u32, ClusterShape),
        groups: Option<&'a DeviceGroups>,
        slot: Option<&'a mut splitk::Workspace<'_>>,
    ) -> Result<(Launch<'a>, Persistent)> {
        let size = cluster.size();
        let ctas = persistent_ctas(*schedule, wanted, self.resident(size), size)?;
        let mut launch =
            Launch::persistent(stream, &self.func, ctas, self.threads, self.smem, size);
        let groups = DeviceGroups::params(groups, &mut launch);
        let splitk = SplitK::params(&mut launch, slot, stream, schedule, cluster)?;
        Ok((
            launch,
            Persistent {
                ctas,
                groups,
                splitk,
            },
        ))
    }
}

/// The kernel of `kernels` whose row is `def`; `missing` says why there is none.
pub(crate) fn find<'k, D: PartialEq>(
    kernels: &'k [Kernel<D>],
    def: Option<&'static D>,
    missing: impl FnOnce() -> Error,
) -> Result<&'k Kernel<D>> {
    kernels
        .iter()
        .find(|k| Some(k.def) == def)
        .ok_or_else(missing)
}

/// What the shared steps of a persistent launch set (beside the launch itself, on which the
/// family then sets its operands' addresses): the grid and the parameters the family's carry.
#[derive(Clone, Copy)]
pub(crate) struct Persistent {
    /// CTAs in the grid.
    pub(crate) ctas: u32,
    pub(crate) groups: GroupParams,
    pub(crate) splitk: SplitKParams,
}

/// CTAs for a persistent launch of `schedule`'s units: `wanted`, at most `resident` (those that
/// fit the GPU at once: no second wave), in whole clusters of `cluster`, and at most one per
/// tile of the units (a cluster's worth per unit).
pub(crate) fn persistent_ctas(
    schedule: Schedule,
    wanted: u32,
    resident: u32,
    cluster: u32,
) -> Result<u32> {
    let units = schedule
        .units()
        .ok_or_else(|| shape("the scheduler's unit count must fit 32 bits"))?
        as u32;
    Ok((wanted.min(resident) / cluster * cluster).clamp(cluster, units.max(1) * cluster))
}

/// The rules every persistent Hopper launch of `block_k`-wide K blocks obeys, for `m_tiles` ×
/// `n_tiles` tiles banded `group_m` at a time: at least one CTA, TMA's 32-bit coordinates, a
/// split of the K blocks, the scheduler's 32-bit unit count, and the split-K workspace's size.
pub(crate) fn validate_schedule(
    s: &GemmShape,
    (m_tiles, n_tiles): (usize, usize),
    block_k: u32,
    (group_m, ctas, split_k): (u32, u32, u32),
) -> Result<()> {
    if ctas == 0 {
        return Err(config("ctas = 0: a launch needs at least one CTA"));
    }
    if s.m > i32::MAX as usize || s.n > i32::MAX as usize || s.k > i32::MAX as usize {
        return Err(shape("M, N and K must fit TMA's 32-bit coordinates"));
    }
    let k_blocks = s.k.div_ceil(block_k as usize);
    splitk::check_split(split_k, k_blocks, block_k, s.k)?;
    if !(1..=m_tiles).contains(&(group_m as usize)) {
        return Err(config(format!(
            "group_m = {group_m}: there are {m_tiles} tiles to band"
        )));
    }
    let units = [n_tiles, s.l, split_k as usize]
        .iter()
        .try_fold(m_tiles, |acc, &x| acc.checked_mul(x));
    if units.is_none_or(|u| u > u32::MAX as usize) {
        return Err(shape(format!(
            "{m_tiles} × {n_tiles} tiles × L = {} × split {split_k}: the scheduler counts at \
             most 2³² − 1",
            s.l
        )));
    }
    splitk::validate(s, split_k)
}
