//! The kernels this crate exports, with what the builder must write into the PTX for each.
//! `host/build.rs` passes [`KERNELS`] to `blockscaled-builder`; the host looks kernels up by the
//! same names, so a renamed kernel fails at build time, not at launch. Each family lists its own
//! kernels once (e.g. [`crate::sm90::KERNELS`]); this table only gathers them.

pub use crate::kernel_info::KernelInfo;

const ALL_TARGETS: &[&str] = &["sm_90a", "sm_100a"];

/// The SIMT reference GEMM: every format and scale layout, float64 accumulation.
pub const REFERENCE_GEMM: KernelInfo = KernelInfo {
    name: "reference_blockscaled_gemm",
    max_threads: Some(crate::params::REFERENCE_BLOCK_THREADS),
    min_blocks_per_sm: 1,
    targets: ALL_TARGETS,
};

/// The reference kernel and the `info` of every row of the families' lists `$list`, in order.
macro_rules! gather {
    ($($list:expr),*) => {{
        let mut all = [REFERENCE_GEMM; 1 $(+ $list.len())*];
        let mut at = 1;
        $(
            let list = $list;
            let mut i = 0;
            while i < list.len() {
                all[at] = list[i].info;
                at += 1;
                i += 1;
            }
        )*
        let _ = at;
        all
    }};
}

/// Every kernel, for the builder (which gives each entry point its launch bounds from here:
/// a kernel missing from this table gets none, and ptxas then ignores its `setmaxnreg`).
pub const KERNELS: &[KernelInfo] = &gather!(
    crate::sm90::KERNELS,
    crate::sm90_mx::KERNELS,
    crate::sm90_w4::KERNELS,
    crate::sm90_w4::stream::KERNELS,
    crate::sm90_w4::fp8::KERNELS,
    crate::fold::KERNELS,
    crate::sm90::GROUPED_KERNELS,
    crate::sm90::SPARSE_KERNELS,
    crate::sm90::FUSED_KERNELS,
    crate::sm90::FUSED_IN_REGISTERS_KERNELS,
    crate::sm90::FUSED_IN_REGISTERS_MX_KERNELS,
    crate::sm90_half::KERNELS,
    crate::quantize::KERNELS,
    crate::quantize::AMAX,
    crate::quantize::ROW_KERNELS,
    crate::prepare::KERNELS,
    crate::moe::KERNELS
);

/// The dynamic shared-memory array's name as a literal, so `asm!` templates can `concat!` it.
#[macro_export]
macro_rules! smem_symbol {
    () => {
        "blockscaled_dynamic_smem"
    };
}

/// The name of the dynamic shared-memory array every module declares (see `ptx::smem`).
pub const DYNAMIC_SMEM_SYMBOL: &str = smem_symbol!();
/// Its alignment: TMA destinations with 128-byte swizzle need 1024-byte-aligned tiles.
pub const DYNAMIC_SMEM_ALIGN: u32 = 1024;

#[cfg(test)]
mod tests {
    use super::KERNELS;

    /// Every kernel of the FP8 family's lists is in the table (one missing gets no launch
    /// bounds, and then too many registers to launch).
    #[test]
    fn every_fp8_family_kernel_has_its_launch_bounds_here() {
        for list in crate::sm90::LISTS {
            for k in list {
                assert!(
                    KERNELS.iter().any(|i| i.name == k.info.name),
                    "{}",
                    k.info.name
                );
            }
        }
    }
}
