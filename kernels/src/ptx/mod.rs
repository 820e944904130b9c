//! One module per PTX instruction family; each function is one instruction or one fixed idiom.
//! Kernels call these and never write `asm!` themselves, so a kernel reads as its algorithm.
//!
//! Sections cited are those of NVIDIA's *Parallel Thread Execution ISA* (version 9.0), by title.
//! Shared-memory addresses are 32-bit offsets in the shared window (`.shared::cta`), as produced
//! by [`smem::dynamic_base`]; global and tensor-map addresses are 64-bit generic addresses.

pub mod bits;
pub mod convert;
pub mod cp_async;
pub mod global;
pub mod half;
pub mod math;
pub mod mbarrier;
#[cfg(any(target_feature = "sm_90a", target_feature = "sm_100a"))]
pub mod mma;
pub mod smem;
#[cfg(target_feature = "sm_100a")]
pub mod tcgen05;
pub mod thread;
pub mod tma;
#[cfg(any(target_feature = "sm_90a", target_feature = "sm_100a"))]
pub mod wgmma;
