//! Split-K reduction: sums the f32 partial results of a GEMM whose K blocks were split over
//! several work units (each writes workspace entry `WorkUnit::out_l`) and converts them to the
//! output type. Memory-bound
//! SIMT: each thread takes four consecutive elements, loads their partials with 16-byte loads,
//! up to [`IN_FLIGHT`] partials at a time, and adds them in the order s = 0, 1, … (deterministic).

use crate::params::{OutType, SPLITK_THREADS, SplitKParams};
use crate::ptx::{convert, global, thread};

/// Partials loaded before they are added: independent loads in flight per thread (one at a time,
/// the kernel is latency-bound; docs/PERF.md, v15).
const IN_FLIGHT: u64 = 4;

/// # Safety
/// `ws` (16-byte aligned) holds `l · split · mn` f32 values and `out` (8-byte aligned) `l · mn`
/// values of `out_type`; launched with `SPLITK_THREADS` threads per block and a grid over
/// `mn / 4` (x) and `l` (y).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn splitk_reduce(p: SplitKParams) {
    // Launched as a programmatic dependent of the GEMM (it may start during the GEMM's last
    // tiles): the partials are complete and visible only after this.
    thread::grid_dependency_wait();
    let l = thread::block_y() as u64;
    let split = p.split as u64;
    let entry = |s: u64| p.ws + 4 * (l * split + s) * p.mn;
    let mut i = 4 * (thread::block_x() * SPLITK_THREADS + thread::thread_x()) as u64;
    let stride = 4 * (thread::grid_dim_x() * SPLITK_THREADS) as u64;
    // Whole float4s when every entry starts 16-byte aligned; else element by element.
    let vector = p.mn % 4 == 0;
    while i < p.mn {
        let mut sum = [0.0f32; 4];
        if vector {
            let mut s = 0;
            while s < split {
                let mut v = [[0.0f32; 4]; IN_FLIGHT as usize];
                for (j, v) in v.iter_mut().enumerate() {
                    if s + (j as u64) < split {
                        // SAFETY: entry s + j < split, elements i..i+4 ≤ mn, 16-byte aligned.
                        *v = unsafe { global::load_f32x4(entry(s + j as u64) + 4 * i) };
                    }
                }
                for (j, v) in v.iter().enumerate() {
                    if s + (j as u64) < split {
                        for e in 0..4 {
                            sum[e] += v[e];
                        }
                    }
                }
                s += IN_FLIGHT;
            }
        } else {
            for (e, sum) in sum.iter_mut().enumerate() {
                if i + (e as u64) < p.mn {
                    for s in 0..split {
                        // SAFETY: entry s < split, element i + e < mn.
                        *sum += unsafe { *((entry(s) + 4 * (i + e as u64)) as *const f32) };
                    }
                }
            }
        }
        // SAFETY: elements i.. of output entry l that are < mn (all four on the vector path,
        // where the 8-/16-byte stores are aligned because mn % 4 == 0 and i % 4 == 0).
        unsafe { store4(&p, l * p.mn + i, &sum, (p.mn - i).min(4), vector) };
        i += stride;
    }
}

/// Writes `count` ≤ 4 of `v` to output element `o`.. in the output type; as two 8-byte (f32) or
/// one 8-byte (16-bit pairs) stores when `vector`.
/// # Safety
/// Output elements `o..o + count` exist; with `vector`, `count` = 4 and `o % 4 == 0`.
#[inline(always)]
unsafe fn store4(p: &SplitKParams, o: u64, v: &[f32; 4], count: u64, vector: bool) {
    let f32_out = p.out_type == OutType::F32 as u32;
    let bf16 = p.out_type == OutType::Bf16 as u32;
    // SAFETY: the caller's contract.
    unsafe {
        if vector {
            if f32_out {
                let a = p.out + 4 * o;
                global::store_u32x2_if(a, v[0].to_bits(), v[1].to_bits(), true);
                global::store_u32x2_if(a + 8, v[2].to_bits(), v[3].to_bits(), true);
            } else {
                let (lo, hi) = if bf16 {
                    (
                        convert::f32x2_to_bf16x2(v[0], v[1]),
                        convert::f32x2_to_bf16x2(v[2], v[3]),
                    )
                } else {
                    (
                        convert::f32x2_to_f16x2(v[0], v[1]),
                        convert::f32x2_to_f16x2(v[2], v[3]),
                    )
                };
                global::store_u32x2_if(p.out + 2 * o, lo, hi, true);
            }
        } else {
            for (e, &x) in v.iter().enumerate() {
                let e = e as u64;
                if e >= count {
                    break;
                }
                if f32_out {
                    *((p.out + 4 * (o + e)) as *mut f32) = x;
                } else if bf16 {
                    *((p.out + 2 * (o + e)) as *mut u16) = convert::f32_to_bf16(x);
                } else {
                    *((p.out + 2 * (o + e)) as *mut u16) = convert::f32_to_f16(x);
                }
            }
        }
    }
}
