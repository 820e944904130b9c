//! What the builder and the host need to know of one kernel entry point: a leaf module that every
//! family's kernel table names, so that the registry, which gathers those tables, imports the
//! families and no family imports the registry.

/// One kernel entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelInfo {
    /// The exported (unmangled) symbol.
    pub name: &'static str,
    /// Threads per block the kernel is written for: becomes `.maxntid N, 1, 1`, the register cap
    /// ptxas needs before it honours `setmaxnreg`. `None`: no bound (any block size).
    pub max_threads: Option<u32>,
    /// `.minnctapersm`: blocks that must fit on one SM.
    pub min_blocks_per_sm: u32,
    /// The GPU targets whose module contains this kernel (`llc -mcpu` names).
    pub targets: &'static [&'static str],
}

impl KernelInfo {
    /// A Hopper-only kernel (`wgmma`, TMA multicast and the sm_90a conversions exist there only)
    /// written for `threads` per block, one block per SM at least.
    pub const fn sm90(name: &'static str, threads: u32) -> KernelInfo {
        KernelInfo {
            name,
            max_threads: Some(threads),
            min_blocks_per_sm: 1,
            targets: &["sm_90a"],
        }
    }
}
