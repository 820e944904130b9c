//! Global memory: stores under a predicate, vector loads and stores, and the fence and atomic
//! that let CTAs of one grid hand data to each other. PTX ISA: "Data Movement and Conversion
//! Instructions: st" with an instruction predicate (`@p st.global…`), "ld"; "Parallel
//! Synchronization and Communication Instructions: membar / fence" and "atom"; "Memory Consistency
//! Model" for the release / acquire patterns. A predicated store instead of a branch keeps code
//! after `wgmma` non-divergent (ptxas serializes wgmma around divergent paths, C7518).

use core::arch::asm;

/// `*addr = v` if `pred` (4-byte store).
/// # Safety
/// When `pred`, `addr` is a valid, 4-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u32_if(addr: u64, v: u32, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "@p st.global.b32 [{a}], {v}; }}",
             a = in(reg64) addr, v = in(reg32) v, c = in(reg32) pred as u32, options(nostack))
    };
}

/// `*addr = v` if `pred` (1-byte store).
/// # Safety
/// When `pred`, `addr` is a valid global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u8_if(addr: u64, v: u32, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "@p st.global.b8 [{a}], {v}; }}",
             a = in(reg64) addr, v = in(reg32) v, c = in(reg32) pred as u32, options(nostack))
    };
}

/// `*addr = v` if `pred` (2-byte store).
/// # Safety
/// When `pred`, `addr` is a valid, 2-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u16_if(addr: u64, v: u16, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "@p st.global.b16 [{a}], {v}; }}",
             a = in(reg64) addr, v = in(reg16) v, c = in(reg32) pred as u32, options(nostack))
    };
}

/// `*addr = [x, y]` if `pred` (8-byte store).
/// # Safety
/// When `pred`, `addr` is a valid, 8-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u32x2_if(addr: u64, x: u32, y: u32, pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;", "@p st.global.v2.b32 [{a}], {{{x}, {y}}}; }}",
             a = in(reg64) addr, x = in(reg32) x, y = in(reg32) y, c = in(reg32) pred as u32, options(nostack))
    };
}

/// `*addr = v` if `pred` (16-byte store, `v[0]` at the low address).
/// # Safety
/// When `pred`, `addr` is a valid, 16-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_u32x4_if(addr: u64, v: [u32; 4], pred: bool) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("{{ .reg .pred p;", "setp.ne.b32 p, {c}, 0;",
             "@p st.global.v4.b32 [{a}], {{{x}, {y}, {z}, {w}}}; }}",
             a = in(reg64) addr, x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2],
             w = in(reg32) v[3], c = in(reg32) pred as u32, options(nostack))
    };
}

/// `ld.global.nc.b32`: 32 bits through the non-coherent (read-only) data path, for data no
/// thread of the grid writes while the kernel runs (PTX ISA "Data Movement and Conversion
/// Instructions: ld.global.nc").
/// # Safety
/// `addr` is a valid, 4-byte-aligned global address of 4 initialized bytes that nothing writes
/// during the kernel.
#[inline(always)]
pub unsafe fn load_u32_nc(addr: u64) -> u32 {
    let v: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.nc.b32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) addr,
             options(nostack, readonly, preserves_flags))
    };
    v
}

/// `ld.global.nc.u8`: one byte through the read-only path, zero-extended.
/// # Safety
/// As [`load_u32_nc`], for 1 byte at any address.
#[inline(always)]
pub unsafe fn load_u8_nc(addr: u64) -> u32 {
    let v: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.nc.u8 {v}, [{p}];", v = out(reg32) v, p = in(reg64) addr,
             options(nostack, readonly, preserves_flags))
    };
    v
}

/// `ld.global.nc.b16`: 2 bytes through the read-only path.
/// # Safety
/// As [`load_u32_nc`], for 2 bytes at a 2-byte-aligned address.
#[inline(always)]
pub unsafe fn load_u16_nc(addr: u64) -> u16 {
    let v: u16;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.nc.b16 {v}, [{p}];", v = out(reg16) v, p = in(reg64) addr,
             options(nostack, readonly, preserves_flags))
    };
    v
}

/// `ld.global.nc.v2.u32`: 8 bytes through the read-only path.
/// # Safety
/// As [`load_u32_nc`], for 8 bytes at an 8-byte-aligned address.
#[inline(always)]
pub unsafe fn load_u32x2_nc(addr: u64) -> [u32; 2] {
    let (x, y): (u32, u32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.nc.v2.u32 {{{x}, {y}}}, [{p}];", x = out(reg32) x, y = out(reg32) y,
             p = in(reg64) addr, options(nostack, readonly, preserves_flags))
    };
    [x, y]
}

/// `ld.global.nc.L1::no_allocate.v2.u32`: 8 bytes through the read-only path that are read once
/// (a weight stream): they do not displace what the SM's L1 holds for reuse (PTX ISA "Data
/// Movement and Conversion Instructions: ld", eviction priority qualifiers).
/// # Safety
/// As [`load_u32x2_nc`].
#[inline(always)]
pub unsafe fn load_u32x2_stream(addr: u64) -> [u32; 2] {
    let (x, y): (u32, u32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.nc.L1::no_allocate.v2.u32 {{{x}, {y}}}, [{p}];", x = out(reg32) x,
             y = out(reg32) y, p = in(reg64) addr, options(nostack, readonly, preserves_flags))
    };
    [x, y]
}

/// [`load_u32_nc`] of an f32.
/// # Safety
/// As [`load_u32_nc`].
#[inline(always)]
pub unsafe fn load_f32_nc(addr: u64) -> f32 {
    // SAFETY: the caller's contract.
    f32::from_bits(unsafe { load_u32_nc(addr) })
}

/// `ld.global.v4.f32`: four consecutive f32 in one 16-byte load.
/// # Safety
/// `addr` is a valid, 16-byte-aligned global address of four initialized f32.
#[inline(always)]
pub unsafe fn load_f32x4(addr: u64) -> [f32; 4] {
    let (a, b, c, d): (f32, f32, f32, f32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `ld.global.cg.v4.f32`: four consecutive f32 in one 16-byte load, cached in L2 only (data
/// another CTA of this grid wrote: the SM's L1 is not coherent with it).
/// # Safety
/// `addr` is a valid, 16-byte-aligned global address of four initialized f32.
#[inline(always)]
pub unsafe fn load_f32x4_l2(addr: u64) -> [f32; 4] {
    let (a, b, c, d): (f32, f32, f32, f32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.cg.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
             a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d,
             p = in(reg64) addr, options(nostack, readonly))
    };
    [a, b, c, d]
}

/// `st.global.v4.f32`: four consecutive f32 in one 16-byte store.
/// # Safety
/// `addr` is a valid, 16-byte-aligned global address nobody else accesses.
#[inline(always)]
pub unsafe fn store_f32x4(addr: u64, v: [f32; 4]) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("st.global.v4.f32 [{p}], {{{a}, {b}, {c}, {d}}};",
             a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
             p = in(reg64) addr, options(nostack))
    };
}

/// `fence.acq_rel.gpu`: this thread's memory operations before it (and, being cumulative, those
/// it observed, e.g. through a barrier with other threads of its CTA) are ordered before its
/// later ones for every thread of the GPU. Before a counter increment it makes the increment a
/// release; after reading the counter, an acquire.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// `atom.relaxed.gpu.global.add.u32`: adds `v` to the counter at `addr`, returns its old value.
/// # Safety
/// `addr` is a valid, 4-byte-aligned global address.
#[inline(always)]
pub unsafe fn atomic_add_u32(addr: u64, v: u32) -> u32 {
    let old: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("atom.relaxed.gpu.global.add.u32 {o}, [{a}], {v};",
             o = out(reg32) old, a = in(reg64) addr, v = in(reg32) v, options(nostack))
    };
    old
}

/// `red.relaxed.gpu.global.max.u32`: `*addr = max(*addr, v)` as unsigned integers, no result
/// (PTX ISA "Parallel Synchronization and Communication Instructions: red"). The bits of
/// non-negative f32 values order as the values do, so this takes the maximum of magnitudes.
/// # Safety
/// `addr` is a valid, 4-byte-aligned global address.
#[inline(always)]
pub unsafe fn reduce_max_u32(addr: u64, v: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("red.relaxed.gpu.global.max.u32 [{a}], {v};", a = in(reg64) addr, v = in(reg32) v,
             options(nostack))
    };
}

/// `st.relaxed.gpu.global.u32`: sets the counter at `addr` (visible to every later kernel).
/// # Safety
/// `addr` is a valid, 4-byte-aligned global address no other thread accesses now.
#[inline(always)]
pub unsafe fn store_relaxed_u32(addr: u64, v: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("st.relaxed.gpu.global.u32 [{a}], {v};", a = in(reg64) addr, v = in(reg32) v,
             options(nostack))
    };
}
