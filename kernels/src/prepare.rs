//! Operand preparation: the copies of a quantized matrix that the GEMM families read beside its
//! codes and packed scales — scales re-laid out for a kernel (the MX kernel's per-stage bytes, the
//! FP8 kernel's A- and B-role fp32 layouts, the 4-bit-weights kernel's activation scales), each
//! row's largest scale code (the fold pre-pass), and e2m1 weights reordered for the 4-bit-weights
//! kernel.
//!
//! Each copy is described as data ([`Gather`], [`RowTops`], [`W4Reorder`]) whose methods say
//! what every destination byte or scale is. The host runs them over an uploaded matrix's bytes;
//! the device kernels run the same methods over a device quantizer's (or a GEMM's quantized
//! output's) buffers (a thread per destination entry of a re-layout, per chunk of the reorder; a
//! warp per row for the row maxima). One source
//! of every index rule, so both preparations write the same bytes, and a device-quantized matrix
//! needs no copy back to the host before its GEMM.

use crate::kernel_info::KernelInfo;

/// Threads per block of the preparation kernels.
pub const PREPARE_THREADS: u32 = 256;

/// A scale re-layout: destination `[batch][planes][rows_out][per]` of `bytes`-byte scales, entry
/// `(l, p, r, c)` the source scale of element (row `r·row_step`, column `(p·per + c)·k_step`) of
/// batch entry `l`, or zero where that element is past the matrix. Source scale `(l, row block,
/// K block)` at `l·stride_l + rb·stride_r + kb·stride_k` (in scales), a scale spanning
/// `block_rows` × `block_k` elements. Four-byte (fp32) scales are multiplied by `mul` where it is
/// not 1 (the matrix's tensor scale: one f32 product, as the host's exact f64 product rounds).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gather {
    pub src: u64,
    pub dst: u64,
    pub stride_l: u64,
    pub stride_r: u64,
    pub stride_k: u64,
    pub rows: u32,
    pub k: u32,
    pub block_rows: u32,
    pub block_k: u32,
    pub batch: u32,
    pub planes: u32,
    pub rows_out: u32,
    pub per: u32,
    pub row_step: u32,
    pub k_step: u32,
    /// 1 or 4.
    pub bytes: u32,
    pub mul: f32,
}

impl Gather {
    /// Destination entries.
    pub const fn entries(&self) -> u64 {
        self.batch as u64 * self.planes as u64 * self.rows_out as u64 * self.per as u64
    }

    /// The source scale of destination entry `o` (`o < len`), `None` for a zero entry.
    #[inline(always)]
    pub const fn source(&self, o: u64) -> Option<u64> {
        let (per, rows_out, planes) = (self.per as u64, self.rows_out as u64, self.planes as u64);
        let c = o % per;
        let r = (o / per) % rows_out;
        let p = (o / per / rows_out) % planes;
        let l = o / (per * rows_out * planes);
        self.source_at(l as u32, p as u32, r as u32, c as u32)
    }

    /// [`Self::source`] of entry `(l, p, r, c)` (`c < per`, `r < rows_out`, `p < planes`, `l <
    /// batch`): the device's form, whose threads know their indices (a 64-bit division and
    /// remainder per index cost the kernel 11 µs on 1 MB of scales); the divisions by the
    /// block's extent are shifts where it is a power of two.
    #[inline(always)]
    pub const fn source_at(&self, l: u32, p: u32, r: u32, c: u32) -> Option<u64> {
        let row = r as u64 * self.row_step as u64;
        let col = (p as u64 * self.per as u64 + c as u64) * self.k_step as u64;
        if row >= self.rows as u64 || col >= self.k as u64 {
            return None;
        }
        // (Inside the matrix: both fit in u32.)
        let (rb, kb) = (
            div_u32(row as u32, self.block_rows),
            div_u32(col as u32, self.block_k),
        );
        Some(l as u64 * self.stride_l + rb as u64 * self.stride_r + kb as u64 * self.stride_k)
    }
}

/// `a / b` (`b` ≥ 1; 0 is taken as 1): a shift where `b` is a power of two. (Branches, not
/// `checked_div`: the kernel's code stays as measured.)
#[inline(always)]
#[allow(clippy::manual_checked_ops)]
const fn div_u32(a: u32, b: u32) -> u32 {
    if b.is_power_of_two() {
        a >> b.trailing_zeros()
    } else if b == 0 {
        a
    } else {
        a / b
    }
}

/// Each row's largest scale code other than NaN, `[batch][rows_pad]` bytes, zero past the rows
/// (ue4m3, `nv`: the sign bit cleared first, as its decoder ignores it; NaN is `0x7F`; e8m0's NaN
/// is `0xFF`). Source scales `[l][rows][k_blocks]` by the strides, as [`Gather`]'s (one-byte
/// scales, one row per row block).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowTops {
    pub src: u64,
    pub dst: u64,
    pub stride_l: u64,
    pub stride_r: u64,
    pub stride_k: u64,
    pub rows: u32,
    pub k_blocks: u32,
    pub batch: u32,
    pub rows_pad: u32,
    pub nv: u32,
    /// (Explicit padding: the struct is a multiple of 8 bytes with no hidden bytes.)
    pub pad: u32,
}

impl RowTops {
    /// Destination bytes.
    pub const fn entries(&self) -> u64 {
        self.batch as u64 * self.rows_pad as u64
    }

    /// Destination byte `o`, reading source scale bytes with `read` (by index).
    #[inline(always)]
    pub fn top(&self, o: u64, read: impl Fn(u64) -> u32) -> u32 {
        self.top_of(o, (0, 1), read)
    }

    /// The largest of the K blocks `first`, `first + step`, … of destination byte `o`'s row
    /// (the maximum of the `step` parts is [`Self::top`]).
    #[inline(always)]
    pub fn top_of(&self, o: u64, (first, step): (u32, u32), read: impl Fn(u64) -> u32) -> u32 {
        let (l, r) = (o / self.rows_pad as u64, o % self.rows_pad as u64);
        if r >= self.rows as u64 {
            return 0;
        }
        let nan = if self.nv != 0 { 0x7F } else { 0xFF };
        let mut top = 0;
        let row = l * self.stride_l + r * self.stride_r;
        let mut kb = first as u64;
        while kb < self.k_blocks as u64 {
            let c = read(row + kb * self.stride_k);
            let c = if self.nv != 0 { c & 0x7F } else { c };
            if c != nan && c > top {
                top = c;
            }
            kb += step as u64;
        }
        top
    }
}

/// e2m1 weights reordered for the 4-bit-weights kernels: rows in groups of
/// [`crate::sm90_w4::GROUP_ROWS`], `[batch][group][chunk][16 rows][32]` bytes
/// ([`crate::sm90_w4::stored_chunk`]), each 64-K chunk of a row with its codes at the positions
/// [`crate::sm90_w4::weight_k`] gives, zero past K and in the rows that pad the last group.
/// Source codes `[batch][rows][k]`, two per byte (the even element in the low nibble), K a
/// multiple of 32 (rows of whole 16 bytes, as the kernel's tensor maps need), so a chunk's source
/// is 32 bytes, or 16 where K ends half-way through it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct W4Reorder {
    pub src: u64,
    pub dst: u64,
    pub rows: u32,
    pub k: u32,
    pub batch: u32,
    pub chunks: u32,
}

impl W4Reorder {
    /// Row groups per batch entry.
    pub const fn groups(&self) -> u32 {
        self.rows.div_ceil(crate::sm90_w4::GROUP_ROWS)
    }

    /// Destination chunks (32 bytes each, at `32 · q`): every row of every group.
    pub const fn entries(&self) -> u64 {
        self.batch as u64 * (self.groups() * crate::sm90_w4::GROUP_ROWS) as u64 * self.chunks as u64
    }

    /// Chunk `q`'s source: its byte offset and whether it has all 32 bytes (else the first 16);
    /// `None` for a row that pads the last group (zeros). Destination `q` is chunk `c` of row
    /// `16·group + r` of batch entry `l` for `q = ((l·groups + group)·chunks + c)·16 + r`.
    #[inline(always)]
    pub const fn source(&self, q: u64) -> Option<(u64, bool)> {
        let g = crate::sm90_w4::GROUP_ROWS as u64;
        let (r, rest) = (q % g, q / g);
        let (c, lg) = (rest % self.chunks as u64, rest / self.chunks as u64);
        let groups = self.groups() as u64;
        let (l, row) = (lg / groups, (lg % groups) * g + r);
        if row >= self.rows as u64 {
            return None;
        }
        Some((
            (l * self.rows as u64 + row) * (self.k as u64 / 2) + 32 * c,
            64 * c + 64 <= self.k as u64,
        ))
    }

    /// Chunk `q` read from the source codes `data` (the host's copy), reordered.
    pub fn chunk_of(&self, data: &[u8], q: u64) -> [u32; 8] {
        let Some((at, whole)) = self.source(q) else {
            return [0; 8];
        };
        let mut s = [0u32; 8];
        let bytes = &data[at as usize..][..if whole { 32 } else { 16 }];
        for (word, b) in s.iter_mut().zip(bytes.chunks_exact(4)) {
            *word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Self::chunk(s)
    }

    /// A chunk's 32 destination bytes from its 32 source bytes (zero past K), as little-endian
    /// words: destination nibble `p` is source nibble `weight_k(p)`.
    #[inline(always)]
    pub fn chunk(src: [u32; 8]) -> [u32; 8] {
        let mut d = [0u32; 8];
        // (Constant indices once unrolled: 64 shifts and masks, no array in memory.)
        let mut p = 0;
        while p < 64 {
            let s = crate::sm90_w4::weight_k(p);
            d[(p / 8) as usize] |=
                ((src[(s / 8) as usize] >> (4 * (s % 8))) & 0xF) << (4 * (p % 8));
            p += 1;
        }
        d
    }
}

const TARGETS: &[&str] = &["sm_90a", "sm_100a"];

const fn info(name: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        max_threads: Some(PREPARE_THREADS),
        min_blocks_per_sm: 1,
        targets: TARGETS,
    }
}

/// One preparation kernel.
pub struct PrepareKernel {
    pub info: KernelInfo,
}

/// [`Gather`]'s kernel.
pub const GATHER: KernelInfo = info("prepare_gather");
/// [`RowTops`]'s kernel.
pub const ROW_TOPS: KernelInfo = info("prepare_row_tops");
/// [`W4Reorder`]'s kernel.
pub const W4_REORDER: KernelInfo = info("prepare_w4_reorder");

/// Every preparation kernel (the registry's rows).
pub const KERNELS: &[PrepareKernel] = &[
    PrepareKernel { info: GATHER },
    PrepareKernel { info: ROW_TOPS },
    PrepareKernel { info: W4_REORDER },
];

/// Blocks for `len` entries: one thread each, at most `cap` blocks (the threads then go round).
pub fn blocks(len: u64, cap: u32) -> u32 {
    len.div_ceil(PREPARE_THREADS as u64).clamp(1, cap as u64) as u32
}

#[cfg(target_arch = "nvptx64")]
mod entries {
    use super::{Gather, PREPARE_THREADS, RowTops, W4Reorder, div_u32};
    use crate::ptx::{global, math, thread};

    /// This thread's entries: `i`, `i + threads`, … below `len`.
    #[inline(always)]
    fn each(len: u64, mut f: impl FnMut(u64)) {
        let threads = thread::grid_dim_x() as u64 * PREPARE_THREADS as u64;
        let mut o = thread::block_x() as u64 * PREPARE_THREADS as u64 + thread::thread_x() as u64;
        while o < len {
            f(o);
            o += threads;
        }
    }

    /// A thread per destination entry of a plane, `(r, c)`: x goes round the plane's `rows_out ·
    /// per` entries (consecutive threads, consecutive entries: the stores coalesce), y round the
    /// batch's planes. (A thread per run of `per` entries waited on each entry's load in turn:
    /// the FP8 kernel's B-role scales of a 4096-row matrix, 32 runs of 56, took 11.7 µs in one
    /// block. Giving each y block a contiguous share of the planes, for L1 hits along the source
    /// row, measured slower: 7.6 µs against 6.4 for 1 MB of MX scales.)
    /// # Safety
    /// `p.src` holds every scale the layout names, `p.dst` `p.entries()` scales of `p.bytes` (1 or
    /// 4, aligned) that nothing else accesses; blocks of [`PREPARE_THREADS`], x and y any.
    #[unsafe(export_name = "prepare_gather")]
    unsafe extern "ptx-kernel" fn gather(p: Gather) {
        let b = p.bytes as u64;
        let slab = p.rows_out as u64 * p.per as u64;
        let threads = thread::grid_dim_x() as u64 * PREPARE_THREADS as u64;
        let first = thread::block_x() as u64 * PREPARE_THREADS as u64 + thread::thread_x() as u64;
        // (The batch's planes: at most 65535 · 2^26 for any K a matrix takes; the run's batch
        // entry and plane by 32-bit division where they fit, a 64-bit one cost 70 instructions.)
        let runs = p.batch as u64 * p.planes as u64;
        let small = runs <= u32::MAX as u64 && slab <= u32::MAX as u64;
        let mut e = first;
        while e < slab {
            // The entry's row and column of the run (32-bit where the plane's entries fit).
            let (r, c) = if small {
                let r = div_u32(e as u32, p.per);
                (r, e as u32 - r * p.per.max(1))
            } else {
                ((e / p.per as u64) as u32, (e % p.per as u64) as u32)
            };
            let mut y = thread::block_y() as u64;
            while y < runs {
                let (l, pl) = if small {
                    let (y, n) = (y as u32, p.planes.max(1));
                    (y / n, y % n)
                } else {
                    ((y / p.planes as u64) as u32, (y % p.planes as u64) as u32)
                };
                let o = y * slab + e;
                // SAFETY: the launch's contract (source index in the layout, `o < len`).
                unsafe {
                    let v = match p.source_at(l, pl, r, c) {
                        Some(s) if b == 4 && p.mul != 1.0 => {
                            let x = global::load_f32_nc(p.src + 4 * s);
                            math::mul_rn(x, p.mul).to_bits()
                        }
                        Some(s) if b == 4 => global::load_u32_nc(p.src + 4 * s),
                        Some(s) => global::load_u8_nc(p.src + s),
                        None => 0,
                    };
                    if b == 4 {
                        global::store_u32_if(p.dst + 4 * o, v, true);
                    } else {
                        global::store_u8_if(p.dst + o, v, true);
                    }
                }
                y += thread::grid_dim_y() as u64;
            }
            e += threads;
        }
    }

    /// One warp per row: its lanes take every 32nd K block, `redux.sync` the maximum.
    /// # Safety
    /// As [`gather`], for one-byte scales and `p.entries()` destination bytes.
    #[unsafe(export_name = "prepare_row_tops")]
    unsafe extern "ptx-kernel" fn row_tops(p: RowTops) {
        let lane = thread::thread_x() % 32;
        let warps = thread::grid_dim_x() as u64 * (PREPARE_THREADS / 32) as u64;
        let mut o =
            (thread::block_x() as u64 * PREPARE_THREADS as u64 + thread::thread_x() as u64) / 32;
        // (`o` is the same in the warp's lanes: whole warps run the loop and the reduction.)
        while o < p.entries() {
            // SAFETY: the launch's contract.
            unsafe {
                let t = p.top_of(o, (lane, 32), |s| global::load_u8_nc(p.src + s));
                global::store_u8_if(p.dst + o, thread::warp_max_u32(t), lane == 0);
            }
            o += warps;
        }
    }

    /// One thread per 64-K chunk: two 16-byte loads, the nibbles moved in registers, two stores.
    /// # Safety
    /// `p.src` holds `batch · rows · k / 2` code bytes (16-byte aligned, K a multiple of 32),
    /// `p.dst` `32 · p.entries()` bytes (16-byte aligned) nothing else accesses.
    #[unsafe(export_name = "prepare_w4_reorder")]
    unsafe extern "ptx-kernel" fn w4_reorder(p: W4Reorder) {
        each(p.entries(), |q| {
            let bits = |v: [f32; 4]| v.map(f32::to_bits);
            // SAFETY: the launch's contract: a source chunk's first 16 bytes always exist, the
            // next 16 where `whole`.
            unsafe {
                let (lo, hi) = match p.source(q) {
                    Some((at, whole)) => (
                        bits(global::load_f32x4(p.src + at)),
                        if whole {
                            bits(global::load_f32x4(p.src + at + 16))
                        } else {
                            [0; 4]
                        },
                    ),
                    None => ([0; 4], [0; 4]),
                };
                let d = W4Reorder::chunk([lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]);
                let f = |i: usize| [d[i], d[i + 1], d[i + 2], d[i + 3]].map(f32::from_bits);
                global::store_f32x4(p.dst + 32 * q, f(0));
                global::store_f32x4(p.dst + 32 * q + 16, f(4));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    #[test]
    fn a_gather_reads_each_entrys_scale_and_zeroes_what_lies_past_the_matrix() {
        // 3 rows × 100 of K, scales per 1×32 K-major (4 per row), into [2 planes][4 rows][2].
        let g = Gather {
            src: 0,
            dst: 0,
            stride_l: 12,
            stride_r: 4,
            stride_k: 1,
            rows: 3,
            k: 100,
            block_rows: 1,
            block_k: 32,
            batch: 1,
            planes: 2,
            rows_out: 4,
            per: 2,
            row_step: 1,
            k_step: 32,
            bytes: 1,
            mul: 1.0,
        };
        let got: Vec<_> = (0..g.entries()).map(|o| g.source(o)).collect();
        let mut want = Vec::new();
        for p in 0..2u64 {
            for r in 0..4u64 {
                for c in 0..2u64 {
                    let kb = p * 2 + c;
                    want.push((r < 3).then_some(r * 4 + kb));
                }
            }
        }
        assert_eq!(got, want);
    }

    #[test]
    fn row_tops_skip_nan_codes_and_ue4m3_signs() {
        let scales = [0x10u32, 0xFF, 0x20, 0x05, 0x7F, 0x83];
        let t = |nv| RowTops {
            src: 0,
            dst: 0,
            stride_l: 6,
            stride_r: 3,
            stride_k: 1,
            rows: 2,
            k_blocks: 3,
            batch: 1,
            rows_pad: 4,
            nv,
            pad: 0,
        };
        let read = |i: u64| scales[i as usize];
        let e8 = t(0);
        assert_eq!(
            (0..4).map(|o| e8.top(o, read)).collect::<Vec<_>>(),
            [0x20, 0x83, 0, 0]
        );
        let nv = t(1);
        assert_eq!(
            (0..4).map(|o| nv.top(o, read)).collect::<Vec<_>>(),
            [0x7F & 0x20, 0x05, 0, 0]
        );
    }
}
