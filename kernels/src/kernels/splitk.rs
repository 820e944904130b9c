//! Split-K reduction: sums the f32 partial results of a GEMM whose K blocks were split over
//! several CTAs (`Sm90Fp8Params::split_k`) and converts them to the output type. Memory-bound
//! SIMT: each thread reads its element's `split` partials (coalesced across the warp) and writes
//! one output element.

use crate::params::{OutType, SPLITK_THREADS, SplitKParams};
use crate::ptx::{convert, thread};

/// # Safety
/// `ws` holds `l · split · mn` f32 values and `out` `l · mn` values of `out_type`; launched with
/// `SPLITK_THREADS` threads per block and a grid over `mn` (x) and `l` (y).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn splitk_reduce(p: SplitKParams) {
    // Launched as a programmatic dependent of the GEMM (it may start during the GEMM's last
    // tiles): the partials are complete and visible only after this.
    thread::grid_dependency_wait();
    let l = thread::block_y() as u64;
    let mut i = (thread::block_x() * SPLITK_THREADS + thread::thread_x()) as u64;
    let stride = (thread::grid_dim_x() * SPLITK_THREADS) as u64;
    while i < p.mn {
        let mut sum = 0.0f32;
        for s in 0..p.split as u64 {
            // SAFETY: entry l·split + s of the workspace, element i < mn.
            sum += unsafe {
                *(p.ws as *const f32).add(((l * p.split as u64 + s) * p.mn + i) as usize)
            };
        }
        let o = (l * p.mn + i) as usize;
        // SAFETY: element i < mn of output entry l.
        unsafe {
            if p.out_type == OutType::F32 as u32 {
                *(p.out as *mut f32).add(o) = sum;
            } else if p.out_type == OutType::Bf16 as u32 {
                *(p.out as *mut u16).add(o) = convert::f32_to_bf16(sum);
            } else {
                *(p.out as *mut u16).add(o) = convert::f32_to_f16(sum);
            }
        }
        i += stride;
    }
}
