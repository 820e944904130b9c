//! The tensor memory accelerator: bulk tensor copies between global and shared memory.
//! PTX ISA: "Data Movement and Conversion Instructions: cp.async.bulk.tensor",
//! "cp.async.bulk.commit_group", "cp.async.bulk.wait_group", "prefetch.tensormap".
//!
//! "Data Movement and Conversion Instructions: cvta" (the parameter space's generic address).
//!
//! Operand rules: `tmap` names a 128-byte `CUtensorMap`, 64-byte aligned, in the kernel's
//! parameter: `MAP_IN_PARAMS` | its offset in [`crate::params::Mapped`], which the host fills
//! per launch; the instruction takes its generic address, which [`map_address`] gives. Coordinates are element indices, innermost first;
//! out-of-bounds boxes are zero-filled on load and clipped on store. Destinations with 128-byte
//! swizzle are 1024-byte aligned.

use core::arch::asm;

use crate::params::MAP_IN_PARAMS;

/// The generic address of the map `tmap` names: [`MAP_IN_PARAMS`] | its offset in the entry
/// point's parameter. The symbol `blockscaled_entry_params` stands for that parameter: the
/// kernel build replaces it, inside each entry point, by the entry point's first (only)
/// parameter and aligns that parameter to 64 bytes (`blockscaled-builder`'s PTX step, which
/// refuses the symbol anywhere else). Not `pure`: computed again at each use rather than held
/// in registers across a loop (the producers run on few).
#[inline(always)]
pub fn map_address(tmap: u64) -> u64 {
    let address: u64;
    // SAFETY: reads the address of the entry point's parameter (a `mov` of its symbol, then
    // the conversion to the generic space) and adds the offset; no memory is touched.
    unsafe {
        asm!("{{ .reg .b64 %base;",
             "mov.b64 %base, blockscaled_entry_params;",
             "cvta.param.u64 %base, %base;",
             "and.b64 {a}, {t}, {mask};",
             "add.s64 {a}, {a}, %base; }}",
             a = out(reg64) address, t = in(reg64) tmap, mask = in(reg64) !MAP_IN_PARAMS,
             options(nomem, nostack))
    };
    address
}

/// Copies `bytes` contiguous bytes from global to shared memory (the non-tensor bulk copy:
/// "cp.async.bulk"); completion is counted on `bar` like a tensor load.
/// # Safety
/// `dst` and `src` are 16-byte aligned, `bytes` is a multiple of 16, both ranges are valid.
#[inline(always)]
pub unsafe fn load_bytes(dst: u32, src: u64, bytes: u32, bar: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, b = in(reg32) bar, options(nostack))
    };
}

/// Loads a 3-D box (e.g. batch as the outer coordinate); completion is counted in bytes on `bar`.
/// # Safety
/// `dst` has room for the box; `bar` expects the bytes (see `mbarrier::arrive_expect_tx`).
#[inline(always)]
pub unsafe fn load_3d(dst: u32, tmap: u64, x: i32, y: i32, z: i32, bar: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}];",
             d = in(reg32) dst, m = in(reg64) map_address(tmap), x = in(reg32) x, y = in(reg32) y, z = in(reg32) z,
             b = in(reg32) bar, options(nostack))
    };
}

/// Loads a 4-D box; completion is counted in bytes on `bar`.
/// # Safety
/// As [`load_3d`].
#[inline(always)]
pub unsafe fn load_4d(dst: u32, tmap: u64, [x, y, z, w]: [i32; 4], bar: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}, {w}}}], [{b}];",
             d = in(reg32) dst, m = in(reg64) map_address(tmap), x = in(reg32) x, y = in(reg32) y, z = in(reg32) z,
             w = in(reg32) w, b = in(reg32) bar, options(nostack))
    };
}

/// Loads a 3-D box into the same shared offset of every CTA in `cta_mask`; each destination CTA's
/// barrier at offset `bar` receives the bytes that land in it.
/// # Safety
/// As [`load_3d`], in every CTA of the mask.
#[inline(always)]
pub unsafe fn load_3d_multicast(
    dst: u32,
    tmap: u64,
    x: i32,
    y: i32,
    z: i32,
    bar: u32,
    cta_mask: u16,
) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}], {k};",
             d = in(reg32) dst, m = in(reg64) map_address(tmap), x = in(reg32) x, y = in(reg32) y, z = in(reg32) z, b = in(reg32) bar,
             k = in(reg16) cta_mask, options(nostack))
    };
}

/// Stores a 3-D box from shared memory; completes in a bulk group (see [`commit`] / [`wait_read`]).
/// # Safety
/// `src` holds the box, written before a `smem::fence_async_proxy` by each writer.
#[inline(always)]
pub unsafe fn store_3d(tmap: u64, x: i32, y: i32, z: i32, src: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [{m}, {{{x}, {y}, {z}}}], [{s}];",
             m = in(reg64) map_address(tmap), x = in(reg32) x, y = in(reg32) y, z = in(reg32) z, s = in(reg32) src,
             options(nostack))
    };
}

/// Closes the current bulk group of stores.
#[inline(always)]
pub fn commit() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) };
}

/// Waits until at most `N` bulk groups still read their shared-memory source.
#[inline(always)]
pub fn wait_read<const N: u32>() {
    // SAFETY: no memory operands.
    unsafe { asm!("cp.async.bulk.wait_group.read {n};", n = const N, options(nostack)) };
}

/// Waits until at most `N` bulk groups are incomplete (their writes done and visible).
#[inline(always)]
pub fn wait<const N: u32>() {
    // SAFETY: no memory operands.
    unsafe { asm!("cp.async.bulk.wait_group {n};", n = const N, options(nostack)) };
}

/// Brings a tensor map into the cache ahead of its first use.
/// # Safety
/// `tmap` names a tensor map (module rules).
#[inline(always)]
pub unsafe fn prefetch_map(tmap: u64) {
    // SAFETY: the caller's contract; a prefetch has no visible effect.
    unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) map_address(tmap), options(nostack)) };
}
