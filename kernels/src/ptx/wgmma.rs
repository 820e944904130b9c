//! Warpgroup matrix multiply-accumulate (sm_90a).
//! PTX ISA: "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"
//! (`wgmma.fence`, `wgmma.mma_async`, `wgmma.commit_group`, `wgmma.wait_group`) and its
//! "Matrix Descriptor Format" section.
//!
//! Operand rules: issued by all 128 threads of a warpgroup (4 consecutive warps starting at a warp
//! index divisible by 4). A and B come from shared memory through 64-bit descriptors; the f32
//! accumulator fragment lives in registers: thread t (warp w = t/32, lane l) holds, for
//! m64nNk32, value i at row `16w + l/4 + 8·((i/2)%2)`, column `8·(i/4) + 2·(l%4) + (i%2)`.
//! ptxas assembles these to `QGMMA.64xNx32.F32.<A>.<B>` (SASS); the bf16 form m64nNk16 (same
//! fragment order) to `HGMMA.64xNx16.F32.BF16`.

use core::arch::asm;

use crate::format::ElemType;

/// Shared-memory layout of a K-major operand tile, as the descriptor's bits 62–63 encode it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Swizzle {
    None = 0,
    B128 = 1,
    B64 = 2,
    B32 = 3,
}

/// A wgmma shared-memory matrix descriptor, kept as its two 32-bit halves.
/// Bits 0–13: start address >> 4; 16–29: leading-dimension byte offset >> 4; 32–45: stride-
/// dimension byte offset >> 4; 49–51: base offset (0: tiles are 1024-byte aligned); 62–63: swizzle.
/// For K-major tiles: LBO is the byte step between core matrices along K (unused with 128-byte
/// swizzle, where one row already spans the K-block), SBO the byte step between 8-row groups
/// (1024 with 128-byte swizzle: 8 rows × 128 bytes).
/// Why halves: only the low word changes from one K step to the next, and the high word is the
/// same for every tile of a kernel; as one u64 every step cost a 64-bit add (two instructions and
/// two registers per descriptor), which ptxas paid for with registers the accumulators need. The
/// halves are joined by a `mov.b64` inside each MMA's `asm!`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub lo: u32,
    pub hi: u32,
}

impl Descriptor {
    #[inline(always)]
    pub const fn new(smem_addr: u32, lbo: u32, sbo: u32, swizzle: Swizzle) -> Self {
        Descriptor {
            lo: ((smem_addr >> 4) & 0x3FFF) | (((lbo >> 4) & 0x3FFF) << 16),
            hi: ((sbo >> 4) & 0x3FFF) | ((swizzle as u32) << 30),
        }
    }

    /// The same layout starting `bytes` further on (the k-step inside a swizzled row: 32 bytes per
    /// 32 e4m3 elements). `bytes` is a multiple of 16 and the advanced address is still inside
    /// shared memory (< 256 KiB), so the 14-bit start-address field cannot carry into the LBO.
    #[inline(always)]
    pub const fn advance(self, bytes: u32) -> Self {
        Descriptor {
            lo: self.lo + (bytes >> 4),
            hi: self.hi,
        }
    }
}

/// The accumulator fragment's first row of warpgroup thread `local` (0..128), as the module doc
/// gives it: `16·warp + lane/4`; its second row is 8 below.
#[inline(always)]
pub const fn fragment_row(local: u32) -> u32 {
    16 * (local / 32) + (local % 32) / 4
}

/// Orders this warpgroup's register accesses to the accumulators before the next `mma_async`.
#[inline(always)]
pub fn fence() {
    // SAFETY: `.sync.aligned`: all threads of the warpgroup execute it.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// Closes the group of issued `mma_async` operations.
#[inline(always)]
pub fn commit() {
    // SAFETY: as above.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// Waits until at most `N` committed groups are pending. The accumulator registers of completed
/// groups may then be read.
#[inline(always)]
pub fn wait<const N: u32>() {
    // SAFETY: as above.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) };
}

/// Calls `$mac!($args…, 0, 1, …, 63)`: the register indices of a 64-register accumulator
/// fragment, spelled once for every macro that must name each register in an `asm!`.
macro_rules! with_regs_64 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
            23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46,
            47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63);
    };
}

/// As `with_regs_64!` for a 128-register fragment (m64n256).
macro_rules! with_regs_128 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
            23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46,
            47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70,
            71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94,
            95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114,
            115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127);
    };
}

/// As `with_regs_64!` for an 8-register fragment (m64n16).
macro_rules! with_regs_8 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7);
    };
}

/// As `with_regs_64!` for a 16-register fragment (m64n32).
macro_rules! with_regs_16 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    };
}

/// As `with_regs_64!` for a 32-register fragment (m64n64k32).
macro_rules! with_regs_32 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
            23, 24, 25, 26, 27, 28, 29, 30, 31);
    };
}

/// As `with_regs_64!` for a 72-register fragment (m64n144k32: the wide tiles).
macro_rules! with_regs_72 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
            21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
            43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64,
            65, 66, 67, 68, 69, 70, 71);
    };
}

/// As `with_regs_64!` for a 80-register fragment (m64n160k32: the wide tiles).
macro_rules! with_regs_80 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
            21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
            43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64,
            65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79);
    };
}

/// As `with_regs_64!` for a 96-register fragment (m64n192k32: the wide tiles).
macro_rules! with_regs_96 {
    ($mac:ident!($($args:tt)*)) => {
        $mac!($($args)*, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
            21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42,
            43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64,
            65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86,
            87, 88, 89, 90, 91, 92, 93, 94, 95);
    };
}

/// Expands to one `wgmma.mma_async` with `N/2` f32 accumulator registers (m64nNk32, FP8 types
/// `$at`·`$bt`). The register list is spelled out because `asm!` needs every operand named.
macro_rules! mma_fp8 {
    ($name:ident, $at:literal, $bt:literal, $n:literal, $first:literal $(, $i:literal)*) => {
        /// `wgmma.mma_async.sync.aligned.m64nNk32.f32.atype.btype` with N and the types in the name:
        /// D (64×N f32, `N/2` registers per thread in the fragment order of the module doc) =
        /// A·Bᵀ (+ D if `accumulate`); A 64×32 and B N×32, K-major in shared memory.
        /// # Safety
        /// The descriptors describe initialized shared memory visible to the async proxy; the caller
/// brackets the call with [`fence`] / [`commit`] / [`wait`] before reading the fragment.
        #[inline(always)]
        pub unsafe fn $name(d: &mut [f32; $n / 2], a: Descriptor, b: Descriptor, accumulate: bool) {
            // SAFETY: the caller's contract.
            unsafe {
                asm!(
                    "{{ .reg .pred p; .reg .b64 da, db;",
                    "setp.ne.b32 p, {acc}, 0;",
                    "mov.b64 da, {{{alo}, {ahi}}}; mov.b64 db, {{{blo}, {bhi}}};",
                    concat!("wgmma.mma_async.sync.aligned.m64n", stringify!($n), "k32.f32.", $at, ".", $bt, " {{",
                            "{", stringify!($first), "}" $(, ", {", stringify!($i), "}")*,
                            "}}, da, db, p, 1, 1; }}"),
                    inout(reg32) d[$first] $(, inout(reg32) d[$i])*,
                    alo = in(reg32) a.lo, ahi = in(reg32) a.hi, blo = in(reg32) b.lo, bhi = in(reg32) b.hi,
                    acc = in(reg32) accumulate as u32,
                    options(nostack)
                )
            };
        }
    };
}

/// As `mma_fp8!` for the first MMA of a sum: D = A·Bᵀ (scale-d 0), the registers are outputs only,
/// so no initial value has to be materialized in them (a zero fed into an accumulator register
/// would tie it to other uses of that zero, which ptxas then treats as wgmma-defined).
macro_rules! mma_fp8_first {
    ($name:ident, $at:literal, $bt:literal, $n:literal, $first:literal $(, $i:literal)*) => {
        /// D (64×N f32) = A·Bᵀ, overwriting D. See the `mma_m64n…` function of the same N.
        /// # Safety
        /// The descriptors describe initialized shared memory visible to the async proxy; the caller
/// brackets the call with [`fence`] / [`commit`] / [`wait`] before reading the fragment.
        #[inline(always)]
        pub unsafe fn $name(a: Descriptor, b: Descriptor) -> [f32; $n / 2] {
            let mut d = [0.0f32; $n / 2];
            // SAFETY: the caller's contract.
            unsafe {
                asm!(
                    "{{ .reg .b64 da, db;",
                    "mov.b64 da, {{{alo}, {ahi}}}; mov.b64 db, {{{blo}, {bhi}}};",
                    concat!("wgmma.mma_async.sync.aligned.m64n", stringify!($n), "k32.f32.", $at, ".", $bt, " {{",
                            "{", stringify!($first), "}" $(, ", {", stringify!($i), "}")*,
                            "}}, da, db, 0, 1, 1; }}"),
                    out(reg32) d[$first] $(, out(reg32) d[$i])*,
                    alo = in(reg32) a.lo, ahi = in(reg32) a.hi, blo = in(reg32) b.lo, bhi = in(reg32) b.hi,
                    options(nostack)
                )
            };
            d
        }
    };
}

/// The FP8 element types of A and B as a type, so a kernel is generic over them: the types are
/// part of the `wgmma` instruction's name, which an `asm!` template must spell out. One pair of
/// methods per N the kernels use: `first_nN` (D = A·Bᵀ, scale-d 0) and `acc_nN` (D += A·Bᵀ),
/// m64nNk32 with D 64×N f32 (`N/2` registers per thread).
///
/// # Safety (every method)
/// The descriptors describe initialized shared memory visible to the async proxy; the caller
/// brackets the call with [`fence`] / [`commit`] / [`wait`] before reading the fragment.
#[allow(clippy::missing_safety_doc)]
pub trait Fp8Pair {
    unsafe fn first_n144(a: Descriptor, b: Descriptor) -> [f32; 72];
    unsafe fn acc_n144(d: &mut [f32; 72], a: Descriptor, b: Descriptor);
    unsafe fn first_n160(a: Descriptor, b: Descriptor) -> [f32; 80];
    unsafe fn acc_n160(d: &mut [f32; 80], a: Descriptor, b: Descriptor);
    unsafe fn first_n192(a: Descriptor, b: Descriptor) -> [f32; 96];
    unsafe fn acc_n192(d: &mut [f32; 96], a: Descriptor, b: Descriptor);
    unsafe fn first_n128(a: Descriptor, b: Descriptor) -> [f32; 64];
    unsafe fn acc_n128(d: &mut [f32; 64], a: Descriptor, b: Descriptor);
    unsafe fn first_n64(a: Descriptor, b: Descriptor) -> [f32; 32];
    unsafe fn acc_n64(d: &mut [f32; 32], a: Descriptor, b: Descriptor);
    unsafe fn first_n32(a: Descriptor, b: Descriptor) -> [f32; 16];
    unsafe fn acc_n32(d: &mut [f32; 16], a: Descriptor, b: Descriptor);
    unsafe fn first_n16(a: Descriptor, b: Descriptor) -> [f32; 8];
    unsafe fn acc_n16(d: &mut [f32; 8], a: Descriptor, b: Descriptor);
}

/// The FP8 element types of A and B, as [`ElemType`] values (`ElemType::E4M3 as u32`, …): the
/// type a kernel is generic over. Only the four FP8 pairs implement [`Fp8Pair`].
pub struct Fp8<const A: u32, const B: u32>;

/// The two [`Fp8Pair`] methods of one N: each defines its one-instruction `asm!` function
/// (`mma_fp8_first!` / `mma_fp8!` with the N's register list, `$regs`) and calls it.
macro_rules! fp8_methods {
    ($first:ident, $acc:ident, $at:literal, $bt:literal, $n:literal, $regs:ident) => {
        #[inline(always)]
        unsafe fn $first(a: Descriptor, b: Descriptor) -> [f32; $n / 2] {
            $regs!(mma_fp8_first!(mma, $at, $bt, $n));
            // SAFETY: the caller's contract.
            unsafe { mma(a, b) }
        }
        #[inline(always)]
        unsafe fn $acc(d: &mut [f32; $n / 2], a: Descriptor, b: Descriptor) {
            $regs!(mma_fp8!(mma, $at, $bt, $n));
            // SAFETY: the caller's contract.
            unsafe { mma(d, a, b, true) }
        }
    };
}

/// `impl Fp8Pair` for the element types `$a`, `$b` (PTX type names `$at`, `$bt`).
macro_rules! fp8_pair {
    ($a:ident, $b:ident, $at:literal, $bt:literal) => {
        impl Fp8Pair for Fp8<{ ElemType::$a as u32 }, { ElemType::$b as u32 }> {
            fp8_methods!(first_n144, acc_n144, $at, $bt, 144, with_regs_72);
            fp8_methods!(first_n160, acc_n160, $at, $bt, 160, with_regs_80);
            fp8_methods!(first_n192, acc_n192, $at, $bt, 192, with_regs_96);
            fp8_methods!(first_n128, acc_n128, $at, $bt, 128, with_regs_64);
            fp8_methods!(first_n64, acc_n64, $at, $bt, 64, with_regs_32);
            fp8_methods!(first_n32, acc_n32, $at, $bt, 32, with_regs_16);
            fp8_methods!(first_n16, acc_n16, $at, $bt, 16, with_regs_8);
        }
    };
}

fp8_pair!(E4M3, E4M3, "e4m3", "e4m3");
fp8_pair!(E5M2, E5M2, "e5m2", "e5m2");
fp8_pair!(E4M3, E5M2, "e4m3", "e5m2");
fp8_pair!(E5M2, E4M3, "e5m2", "e4m3");

/// A consumer's accumulator fragment of `wgmma` (m64nNk32 FP8, m64nNk16 bf16): N/2 f32 per
/// thread in the fragment order of the module doc, with the operand fence of that N.
pub trait Fragment: Copy + AsRef<[f32]> + AsMut<[f32]> {
    /// The N of the MMA (columns of the fragment).
    const N: u32;
    /// A fragment of zeros.
    fn zeros() -> Self;
    /// See [`fence_operands_64`].
    fn fence(&mut self);
}

/// A fragment with the FP8 MMAs of its N (m64nNk32: N = 16, 32, 64, 128, and the wide tiles'
/// 144, 160 and 192).
pub trait Fp8Fragment: Fragment {
    /// D = A·Bᵀ.
    /// # Safety
    /// The descriptors describe initialized shared memory visible to the async proxy; the caller
    /// brackets the call with [`fence`] / [`commit`] / [`wait`] before reading the fragment.
    unsafe fn first<T: Fp8Pair>(a: Descriptor, b: Descriptor) -> Self;
    /// D += A·Bᵀ.
    /// # Safety
    /// As [`Fp8Fragment::first`].
    unsafe fn acc<T: Fp8Pair>(&mut self, a: Descriptor, b: Descriptor);
}

/// The 16-bit input type of `wgmma` m64nNk16 (A and B of one type; f32 accumulators): the
/// type's name in the instruction (`.bf16` or `.f16`).
pub trait Fp16: 'static {
    /// Whether the type is IEEE fp16 (else bf16).
    const F16: bool;
}

/// bfloat16 inputs (`.bf16`).
pub struct Bf16;
/// IEEE binary16 inputs (`.f16`).
pub struct F16;

impl Fp16 for Bf16 {
    const F16: bool = false;
}
impl Fp16 for F16 {
    const F16: bool = true;
}

/// A fragment with the 16-bit MMAs of its N (m64nNk16, N = 256, 128 or 64).
pub trait Fp16Fragment: Fragment {
    /// D = A·Bᵀ (+ D if `accumulate`); A 64×16 and B N×16 of type `T`, K-major in shared
    /// memory.
    /// # Safety
    /// As [`Fp8Fragment::first`].
    unsafe fn mma16<T: Fp16>(&mut self, a: Descriptor, b: Descriptor, accumulate: bool);
}

/// `impl Fragment` for an `N/2`-register array with its fence.
macro_rules! fragment {
    ($len:literal, $n:literal, $fence:ident) => {
        impl Fragment for [f32; $len] {
            const N: u32 = $n;
            #[inline(always)]
            fn zeros() -> Self {
                [0.0; $len]
            }
            #[inline(always)]
            fn fence(&mut self) {
                $fence(self)
            }
        }
    };
}

fragment!(128, 256, fence_operands_128);
fragment!(72, 144, fence_operands_72);
fragment!(80, 160, fence_operands_80);
fragment!(96, 192, fence_operands_96);
fragment!(64, 128, fence_operands_64);
fragment!(32, 64, fence_operands_32);
fragment!(16, 32, fence_operands_16);
fragment!(8, 16, fence_operands_8);

/// `impl Fp8Fragment` for an `N/2`-register array with the [`Fp8Pair`] methods of its N.
macro_rules! fp8_fragment {
    ($len:literal, $first:ident, $acc:ident) => {
        impl Fp8Fragment for [f32; $len] {
            #[inline(always)]
            unsafe fn first<T: Fp8Pair>(a: Descriptor, b: Descriptor) -> Self {
                // SAFETY: the caller's contract.
                unsafe { T::$first(a, b) }
            }
            #[inline(always)]
            unsafe fn acc<T: Fp8Pair>(&mut self, a: Descriptor, b: Descriptor) {
                // SAFETY: the caller's contract.
                unsafe { T::$acc(self, a, b) }
            }
        }
    };
}

fp8_fragment!(72, first_n144, acc_n144);
fp8_fragment!(80, first_n160, acc_n160);
fp8_fragment!(96, first_n192, acc_n192);
fp8_fragment!(64, first_n128, acc_n128);
fp8_fragment!(32, first_n64, acc_n64);
fp8_fragment!(16, first_n32, acc_n32);
fp8_fragment!(8, first_n16, acc_n16);

/// Expands to one `wgmma.mma_async` m64nNk16 with 16-bit A and B of type `$t` (`"bf16"` or
/// `"f16"`) and `N/2` f32 accumulator registers (scale-d from `accumulate`, A and B K-major:
/// transpose flags 0).
macro_rules! mma16 {
    ($name:ident, $n:literal, $t:literal, $first:literal $(, $i:literal)*) => {
        /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T` with N and T in the name: D (64×N f32,
        /// `N/2` registers per thread) = A·Bᵀ (+ D if `accumulate`); A 64×16 and B N×16, K-major
        /// in shared memory.
        /// # Safety
        /// The descriptors describe initialized shared memory visible to the async proxy; the
        /// caller brackets the call with [`fence`] / [`commit`] / [`wait`] before reading `d`.
        #[inline(always)]
        pub unsafe fn $name(d: &mut [f32; $n / 2], a: Descriptor, b: Descriptor, accumulate: bool) {
            // SAFETY: the caller's contract.
            unsafe {
                asm!(
                    "{{ .reg .pred p; .reg .b64 da, db;",
                    "setp.ne.b32 p, {acc}, 0;",
                    "mov.b64 da, {{{alo}, {ahi}}}; mov.b64 db, {{{blo}, {bhi}}};",
                    concat!("wgmma.mma_async.sync.aligned.m64n", stringify!($n), "k16.f32.", $t, ".", $t, " {{",
                            "{", stringify!($first), "}" $(, ", {", stringify!($i), "}")*,
                            "}}, da, db, p, 1, 1, 0, 0; }}"),
                    inout(reg32) d[$first] $(, inout(reg32) d[$i])*,
                    alo = in(reg32) a.lo, ahi = in(reg32) a.hi, blo = in(reg32) b.lo, bhi = in(reg32) b.hi,
                    acc = in(reg32) accumulate as u32,
                    options(nostack)
                )
            };
        }
    };
}

with_regs_128!(mma16!(mma_m64n256k16_bf16, 256, "bf16"));
with_regs_64!(mma16!(mma_m64n128k16_bf16, 128, "bf16"));
with_regs_32!(mma16!(mma_m64n64k16_bf16, 64, "bf16"));
with_regs_128!(mma16!(mma_m64n256k16_f16, 256, "f16"));
with_regs_64!(mma16!(mma_m64n128k16_f16, 128, "f16"));
with_regs_32!(mma16!(mma_m64n64k16_f16, 64, "f16"));

/// `impl Fp16Fragment` for an `N/2`-register array with the bf16 and f16 MMAs of its N.
macro_rules! fp16_fragment {
    ($len:literal, $bf16:ident, $f16:ident) => {
        impl Fp16Fragment for [f32; $len] {
            #[inline(always)]
            unsafe fn mma16<T: Fp16>(&mut self, a: Descriptor, b: Descriptor, accumulate: bool) {
                // SAFETY: the caller's contract.
                unsafe {
                    if T::F16 {
                        $f16(self, a, b, accumulate)
                    } else {
                        $bf16(self, a, b, accumulate)
                    }
                }
            }
        }
    };
}

fp16_fragment!(128, mma_m64n256k16_bf16, mma_m64n256k16_f16);
fp16_fragment!(64, mma_m64n128k16_bf16, mma_m64n128k16_f16);
fp16_fragment!(32, mma_m64n64k16_bf16, mma_m64n64k16_f16);

/// A fragment with the bf16 MMA of its N whose A comes from registers (m64nNk16, N = 128 or 16).
pub trait Bf16RsFragment: Fragment {
    /// D = A·Bᵀ (+ D if `accumulate`); A 64×16 bf16 in registers (`a`: this thread's four
    /// bf16x2 words: PTX ISA "Register Fragments and Shared Memory Matrix Layouts", matrix A of
    /// `.m64nNk16`: word j holds row `16w + l/4 + 8·(j%2)`, columns `2·(l%4) + 8·(j/2)` and the
    /// next, low half first), B N×16 bf16, K-major in shared memory.
    /// # Safety
    /// As [`Fp8Fragment::first`]; `a` is not written until the MMA has completed ([`wait`]).
    unsafe fn mma_rs_bf16(&mut self, a: [u32; 4], b: Descriptor, accumulate: bool);
}

/// Expands to one `wgmma.mma_async` with A from registers and B from shared memory: shape
/// m64nN`$k` with the types `$types` (`f32.bf16.bf16`, `f32.e4m3.e4m3`) and the immediates after
/// scale-d `$imm` (scale-a, scale-b, and for 16-bit types B's transpose).
macro_rules! mma_rs {
    ($name:ident, $k:literal, $types:literal, $imm:literal, $n:literal, $first:literal $(, $i:literal)*) => {
        #[doc = concat!("`wgmma.mma_async.sync.aligned.m64nNk", $k, ".", $types, "` with A in registers and N")]
        /// in the name: D (64×N f32) = A·Bᵀ (+ D if `accumulate`); B K-major in shared memory.
        /// # Safety
        /// As [`Bf16RsFragment::mma_rs_bf16`].
        #[inline(always)]
        pub unsafe fn $name(d: &mut [f32; $n / 2], a: [u32; 4], b: Descriptor, accumulate: bool) {
            // SAFETY: the caller's contract.
            unsafe {
                asm!(
                    "{{ .reg .pred p; .reg .b64 db;",
                    "setp.ne.b32 p, {acc}, 0;",
                    "mov.b64 db, {{{blo}, {bhi}}};",
                    concat!("wgmma.mma_async.sync.aligned.m64n", stringify!($n), "k", $k, ".", $types, " {{",
                            "{", stringify!($first), "}" $(, ", {", stringify!($i), "}")*,
                            "}}, {{{a0}, {a1}, {a2}, {a3}}}, db, p", $imm, "; }}"),
                    inout(reg32) d[$first] $(, inout(reg32) d[$i])*,
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    blo = in(reg32) b.lo, bhi = in(reg32) b.hi,
                    acc = in(reg32) accumulate as u32,
                    options(nostack)
                )
            };
        }
    };
}

with_regs_64!(mma_rs!(
    mma_rs_m64n128k16_bf16,
    "16",
    "f32.bf16.bf16",
    ", 1, 1, 0",
    128
));
with_regs_8!(mma_rs!(
    mma_rs_m64n16k16_bf16,
    "16",
    "f32.bf16.bf16",
    ", 1, 1, 0",
    16
));

impl Bf16RsFragment for [f32; 64] {
    #[inline(always)]
    unsafe fn mma_rs_bf16(&mut self, a: [u32; 4], b: Descriptor, accumulate: bool) {
        // SAFETY: the caller's contract.
        unsafe { mma_rs_m64n128k16_bf16(self, a, b, accumulate) }
    }
}

impl Bf16RsFragment for [f32; 8] {
    #[inline(always)]
    unsafe fn mma_rs_bf16(&mut self, a: [u32; 4], b: Descriptor, accumulate: bool) {
        // SAFETY: the caller's contract.
        unsafe { mma_rs_m64n16k16_bf16(self, a, b, accumulate) }
    }
}

/// A fragment with the e4m3 MMA of its N whose A comes from registers (m64nNk32, N = 128).
pub trait Fp8RsFragment: Fragment {
    /// D = A·Bᵀ (+ D if `accumulate`); A 64×32 e4m3 in registers (`a`: this thread's four words
    /// of four e4m3 each: PTX ISA "Register Fragments and Shared Memory Matrix Layouts", matrix A
    /// of `.m64nNk32`: word j holds row `16w + l/4 + 8·(j%2)`, columns `4·(l%4) + 16·(j/2)` and
    /// the next three, lowest byte first), B N×32 e4m3, K-major in shared memory.
    /// # Safety
    /// As [`Fp8Fragment::first`]; `a` is not written until the MMA has completed ([`wait`]).
    unsafe fn mma_rs_e4m3(&mut self, a: [u32; 4], b: Descriptor, accumulate: bool);
}

with_regs_64!(mma_rs!(
    mma_rs_m64n128k32_e4m3,
    "32",
    "f32.e4m3.e4m3",
    ", 1, 1",
    128
));

impl Fp8RsFragment for [f32; 64] {
    #[inline(always)]
    unsafe fn mma_rs_e4m3(&mut self, a: [u32; 4], b: Descriptor, accumulate: bool) {
        // SAFETY: the caller's contract.
        unsafe { mma_rs_m64n128k32_e4m3(self, a, b, accumulate) }
    }
}

/// Expands to an empty `asm!` taking every register of an accumulator array as in-out: placed
/// right after [`wait`], it makes every later use of the registers depend on a point after the
/// wait (the wait itself names no registers, so the compiler could otherwise move reads of an
/// in-flight accumulator above it — and ptxas then serializes the wgmma, C7514).
macro_rules! operand_fence {
    ($name:ident, $len:literal, $first:literal $(, $i:literal)*) => {
        /// Orders all uses of `d` after this point (see the macro's doc). Emits no instruction.
        #[inline(always)]
        pub fn $name(d: &mut [f32; $len]) {
            // SAFETY: an empty template (a PTX comment) that only claims to modify `d`.
            unsafe {
                asm!(
                    concat!("// wgmma operand fence {", stringify!($first), "}" $(, " {", stringify!($i), "}")*),
                    inout(reg32) d[$first] $(, inout(reg32) d[$i])*,
                    options(nostack, nomem, preserves_flags)
                )
            };
        }
    };
}

/// Orders all later writes of `a` (the A fragments of register-operand MMAs, e.g. four
/// [`Bf16RsFragment::mma_rs_bf16`] K steps) after this point: placed right after the [`wait`] for
/// those MMAs, it keeps the registers live, and so unshared with newer values, until the MMAs
/// have read them (PTX ISA, `wgmma.mma_async`: A's registers must not be accessed before the
/// `wgmma.wait_group` that covers the MMA). Emits no instruction.
#[inline(always)]
pub fn fence_a_fragments(a: &mut [[u32; 4]; 4]) {
    // SAFETY: an empty template (a PTX comment) that only claims to modify `a`.
    unsafe {
        asm!(
            "// wgmma A fence {0} {1} {2} {3} {4} {5} {6} {7} {8} {9} {10} {11} {12} {13} {14} {15}",
            inout(reg32) a[0][0], inout(reg32) a[0][1], inout(reg32) a[0][2], inout(reg32) a[0][3],
            inout(reg32) a[1][0], inout(reg32) a[1][1], inout(reg32) a[1][2], inout(reg32) a[1][3],
            inout(reg32) a[2][0], inout(reg32) a[2][1], inout(reg32) a[2][2], inout(reg32) a[2][3],
            inout(reg32) a[3][0], inout(reg32) a[3][1], inout(reg32) a[3][2], inout(reg32) a[3][3],
            options(nostack, nomem, preserves_flags)
        )
    };
}

with_regs_128!(operand_fence!(fence_operands_128, 128));
with_regs_72!(operand_fence!(fence_operands_72, 72));
with_regs_80!(operand_fence!(fence_operands_80, 80));
with_regs_96!(operand_fence!(fence_operands_96, 96));
with_regs_64!(operand_fence!(fence_operands_64, 64));
with_regs_32!(operand_fence!(fence_operands_32, 32));
with_regs_16!(operand_fence!(fence_operands_16, 16));
with_regs_8!(operand_fence!(fence_operands_8, 8));
