//! The SIMT reference block-scaled GEMM: every element format, scale type, scale-block shape and
//! scale layout that `params::OperandParams` can describe, accumulated in float64.
//!
//! It exists to check the fast kernels on shapes too large for the CPU reference, so it is
//! written to be obviously right rather than fast: one thread per output element, the K loop cut
//! into chunks over which both operands' scales are constant, each chunk's sum of exact products
//! (an fp8 or fp4 product fits in a double exactly) multiplied by the two scales in float64.

use crate::format::{ElemType, ScaleType};
use crate::params::{GemmParams, OperandParams, OutType, REFERENCE_BLOCK_M, REFERENCE_BLOCK_N};
use crate::ptx::{convert, thread};

/// One operand, with its codes validated once.
struct Operand<'a> {
    p: &'a OperandParams,
    elem: ElemType,
    scale: ScaleType,
}

impl<'a> Operand<'a> {
    #[inline(always)]
    fn new(p: &'a OperandParams) -> Self {
        // The host validated both codes; an unknown one is a bug and traps rather than guesses.
        let (Some(elem), Some(scale)) = (p.elem_type(), p.scale_kind()) else {
            // SAFETY: `trap` aborts the kernel; nothing is left half-done that matters.
            unsafe { core::arch::nvptx::trap() }
        };
        Operand { p, elem, scale }
    }

    /// Decoded element (l, row, k), without scales.
    #[inline(always)]
    fn element(&self, base: u64, k: u32) -> f64 {
        let i = base + k as u64;
        let code = match self.elem {
            ElemType::E2M1 => {
                // SAFETY: the host checked that the data buffer holds every element it describes.
                let byte = unsafe { *(self.p.data as *const u8).add((i / 2) as usize) };
                (if i % 2 == 0 { byte & 0x0F } else { byte >> 4 }) as u32
            }
            // SAFETY: as above (16-bit data is 2-byte aligned: device allocations are).
            ElemType::BF16 | ElemType::F16 => unsafe {
                *(self.p.data as *const u16).add(i as usize) as u32
            },
            // SAFETY: as above.
            _ => unsafe { *(self.p.data as *const u8).add(i as usize) as u32 },
        };
        self.elem.decode(code) as f64
    }

    /// Decoded scale of the block holding (l, row, k), times the tensor scale.
    #[inline(always)]
    fn scale(&self, l: u32, row: u32, k: u32) -> f64 {
        let p = self.p;
        let s = l as u64 * p.scale_batch_stride
            + (row / p.block_rows) as u64 * p.scale_row_stride
            + (k / p.block_k) as u64 * p.scale_k_stride;
        // SAFETY: the host checked that the scale buffer holds every index the layout produces.
        let bits = unsafe {
            match self.scale.bytes() {
                1 => *(p.scales as *const u8).add(s as usize) as u32,
                _ => *(p.scales as *const u32).add(s as usize),
            }
        };
        self.scale.decode_bits(bits) as f64 * p.tensor_scale as f64
    }

    #[inline(always)]
    fn row_base(&self, l: u32, row: u32) -> u64 {
        l as u64 * self.p.batch_stride + row as u64 * self.p.row_stride
    }
}

/// C[l, m, n] = Σ_k A[l, m, k]·B[l, n, k], dequantized. Grid: (⌈N/32⌉, ⌈M/8⌉, L), block (32, 8).
///
/// # Safety
/// `p` was built by the host from validated matrices: every pointer covers what the strides,
/// shapes and formats say, and `out` is not read or written by anyone else during the launch.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn reference_blockscaled_gemm(p: GemmParams) {
    let n = thread::block_x() * REFERENCE_BLOCK_N + thread::thread_x();
    let m = thread::block_y() * REFERENCE_BLOCK_M + thread::thread_y();
    let l = thread::block_z();
    if m >= p.m || n >= p.n || l >= p.l {
        return;
    }
    let a = Operand::new(&p.a);
    let b = Operand::new(&p.b);
    let (a_base, b_base) = (a.row_base(l, m), b.row_base(l, n));

    let mut acc = 0.0f64;
    let mut k0 = 0u32;
    while k0 < p.k {
        // The chunk ends where either operand's scale block ends.
        let end_a = (k0 / p.a.block_k + 1).saturating_mul(p.a.block_k);
        let end_b = (k0 / p.b.block_k + 1).saturating_mul(p.b.block_k);
        let k1 = end_a.min(end_b).min(p.k);
        let mut part = 0.0f64;
        let mut k = k0;
        while k < k1 {
            part += a.element(a_base, k) * b.element(b_base, k);
            k += 1;
        }
        acc += part * (a.scale(l, m, k0) * b.scale(l, n, k0));
        k0 = k1;
    }

    let i = l as u64 * p.out_batch_stride + m as u64 * p.out_row_stride + n as u64;
    let v = acc as f32;
    // SAFETY: the host sized `out` for L·M·N elements of `out_type` with these strides.
    unsafe {
        match OutType::from_u32(p.out_type) {
            Some(OutType::Bf16) => *(p.out as *mut u16).add(i as usize) = convert::f32_to_bf16(v),
            Some(OutType::F16) => *(p.out as *mut u16).add(i as usize) = convert::f32_to_f16(v),
            Some(OutType::F32) => *(p.out as *mut f32).add(i as usize) = v,
            None => core::arch::nvptx::trap(), // unknown output type: a host bug
        }
    }
}
