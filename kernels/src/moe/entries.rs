//! The MoE kernels ([`super`]'s parameter structs say what each computes).

use super::{
    Combine, MOE_THREADS, Offsets, Pack, Rank, Regroup, RegroupPlan, Route, SWIGLU_BLOCKS,
    ScaleRows, Scoring, SwigluQuantize, order_key, row_in_groups,
};
use crate::format::ElemType;
use crate::format::quantize::magnitude_bits;
use crate::gemm::epilogue::fuse::activate;
use crate::params::Activation;
use crate::ptx::{convert, global, math, smem, thread};
use crate::quantize::device::{Quotient, encode4};

const LOG2_E: f32 = core::f32::consts::LOG2_E;

/// This block's share of `len` items (a block each; the blocks go round).
#[inline(always)]
fn each_block(len: u32, mut f: impl FnMut(u32)) {
    let mut i = thread::block_x();
    while i < len {
        f(i);
        i += thread::grid_dim_x();
    }
}

/// This warp's share of `len` items (a warp each over the grid).
#[inline(always)]
fn each_warp(len: u32, mut f: impl FnMut(u32)) {
    let warps = MOE_THREADS / 32;
    let mut i = thread::block_x() * warps + thread::thread_x() / 32;
    while i < len {
        f(i);
        i += thread::grid_dim_x() * warps;
    }
}

/// # Safety
/// `addr` is a valid, 4-byte-aligned global address.
#[inline(always)]
unsafe fn load_i32(addr: u64) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { global::load_u32_nc(addr) as i32 }
}

/// Copies `bytes` (a multiple of 16) from `src` to `dst` (both 16-byte aligned), the block's
/// threads 16 bytes at a time; zeros where `src` is 0.
/// # Safety
/// Both hold `bytes`; nothing else writes `dst`.
#[inline(always)]
unsafe fn copy_row(src: u64, dst: u64, bytes: u32) {
    let mut at = thread::thread_x() * 16;
    while at < bytes {
        let v = if src == 0 {
            [0; 4]
        } else {
            // SAFETY: the caller's contract.
            unsafe { global::load_f32x4(src + at as u64) }.map(f32::to_bits)
        };
        // SAFETY: as above.
        unsafe { global::store_u32x4_if(dst + at as u64, v, true) };
        at += 16 * MOE_THREADS;
    }
}

/// Copies a row's `k_blocks` scales from `(src, src_rows, r)` to `(dst, dst_rows, d)`, and to
/// `dst2`'s buffer and layout (row `d`) where that buffer is not 0.
/// # Safety
/// Every layout's buffer holds the rows; nothing else writes the destinations'.
#[inline(always)]
unsafe fn copy_scales(
    src: (u64, ScaleRows, u32),
    dst: (u64, ScaleRows, u32),
    dst2: (u64, ScaleRows),
) {
    let mut kb = thread::thread_x();
    while kb < src.1.k_blocks {
        // SAFETY: the caller's contract.
        unsafe {
            let v = global::load_u32_nc(src.0 + 4 * src.1.index(src.2, kb));
            global::store_u32_if(dst.0 + 4 * dst.1.index(dst.2, kb), v, true);
            global::store_u32_if(dst2.0 + 4 * dst2.1.index(dst.2, kb), v, dst2.0 != 0);
        }
        kb += MOE_THREADS;
    }
}

/// The exclusive sum of `v` over the block's threads (fewer than 1025, a multiple of 32) in
/// thread order, and the block's total; `scratch` is 32 words of shared memory. Every thread of
/// the block must call it.
/// # Safety
/// `scratch` is this block's, unused by anything else during the call.
#[inline(always)]
unsafe fn block_exclusive_sum(v: u32, scratch: u32) -> (u32, u32) {
    let (lane, warp) = (thread::thread_x() % 32, thread::thread_x() / 32);
    let mut incl = v;
    for i in 0..5 {
        let s = 1u32 << i;
        let other = thread::shfl_idx_u32(incl, lane.saturating_sub(s));
        if lane >= s {
            incl += other;
        }
    }
    // SAFETY: `scratch` holds 32 words of this block.
    unsafe {
        if lane == 31 {
            smem::store_u32(scratch + 4 * warp, incl);
        }
        thread::sync_block();
        let (mut before, mut total) = (0, 0);
        for w in 0..thread::block_dim_x() / 32 {
            let t = smem::load_u32(scratch + 4 * w);
            before += if w < warp { t } else { 0 };
            total += t;
        }
        thread::sync_block();
        (before + incl - v, total)
    }
}

/// # Safety
/// `p` as [`Route`] says; blocks of [`MOE_THREADS`].
#[unsafe(export_name = "moe_route")]
unsafe extern "ptx-kernel" fn route(p: Route) {
    let lane = thread::thread_x() % 32;
    each_warp(p.tokens, |t| {
        let row = p.logits + 4 * t as u64 * p.experts as u64;
        // SAFETY: `e < p.experts`: inside the token's row.
        let logit = |e: u32| unsafe { global::load_u32_nc(row + 4 * e as u64) };
        let mut taken = 0u32;
        let (mut mine, mut mine_logit) = (0u32, 0u32);
        for r in 0..p.top_k {
            // This lane's best untaken expert (the lowest of equal keys), then the warp's.
            let (mut key, mut best) = (0u32, 0u32);
            let (mut e, mut s) = (lane, 0);
            while e < p.experts {
                let k = order_key(logit(e));
                if taken & (1 << s) == 0 && k > key {
                    (key, best) = (k, e);
                }
                e += 32;
                s += 1;
            }
            let top = thread::warp_max_u32(key);
            let win = thread::warp_min_u32(if key == top && key != 0 {
                best
            } else {
                u32::MAX
            });
            if lane == win % 32 {
                taken |= 1 << (win / 32);
            }
            if lane == r {
                (mine, mine_logit) = (win, logit(win));
            }
        }
        let l = f32::from_bits(mine_logit);
        let first = f32::from_bits(thread::shfl_idx_u32(mine_logit, 0));
        let score = if lane >= p.top_k {
            0.0
        } else if p.scoring == Scoring::Sigmoid as u32 {
            math::recip_approx(1.0 + math::exp2_approx(-l * LOG2_E))
        } else {
            math::exp2_approx((l - first) * LOG2_E)
        };
        let sum = thread::warp_sum_f32(score);
        let at = (t * p.top_k + lane) as u64;
        let live = lane < p.top_k;
        // SAFETY: entry `at` of the token's `top_k` where `live`.
        unsafe {
            global::store_u32_if(p.chosen + 4 * at, mine, live);
            global::store_u32_if(p.weights + 4 * at, (score / sum).to_bits(), live);
        }
    });
}

/// # Safety
/// `p` as [`Rank`] says; a block of [`MOE_THREADS`] per expert, 32 words of shared memory.
#[unsafe(export_name = "moe_rank")]
unsafe extern "ptx-kernel" fn rank(p: Rank) {
    let e = thread::block_x() as i32;
    let scratch = smem::dynamic_base();
    let mut running = 0u32;
    // Four consecutive entries a thread, in entry order across the block.
    let mut base = 0;
    while base < p.entries {
        let first = base + 4 * thread::thread_x();
        let mut hits = [false; 4];
        for (j, h) in hits.iter_mut().enumerate() {
            let i = first + j as u32;
            // SAFETY: `i < p.entries`.
            *h = i < p.entries && unsafe { load_i32(p.chosen + 4 * i as u64) } == e;
        }
        let mine = hits.iter().filter(|&&h| h).count() as u32;
        // SAFETY: `scratch` is this block's 32 words; every thread calls it.
        let (before, total) = unsafe { block_exclusive_sum(mine, scratch) };
        let mut at = running + before;
        for (j, h) in hits.iter().enumerate() {
            // SAFETY: entry `first + j` is in range where it matched.
            unsafe { global::store_u32_if(p.rank + 4 * (first + j as u32) as u64, at, *h) };
            at += *h as u32;
        }
        running += total;
        base += 4 * MOE_THREADS;
    }
    // SAFETY: expert `e`'s count.
    unsafe { global::store_u32_if(p.counts + 4 * e as u64, running, thread::thread_x() == 0) };
}

/// # Safety
/// `p` as [`Offsets`] says; one block of `experts` threads rounded up to 32, with
/// `(32 + experts)` words of shared memory.
#[unsafe(export_name = "moe_offsets")]
unsafe extern "ptx-kernel" fn offsets(p: Offsets) {
    let e = thread::thread_x();
    let live = e < p.experts;
    let (scratch, table) = (smem::dynamic_base(), smem::dynamic_base() + 128);
    // SAFETY: expert `e`'s count where live.
    let count = if live {
        unsafe { load_i32(p.counts + 4 * e as u64) }.max(0) as u32
    } else {
        0
    };
    // SAFETY: the block's scratch; every thread calls it.
    let (before, _) = unsafe { block_exclusive_sum(count, scratch) };
    // SAFETY: `table` holds `experts` words.
    unsafe {
        if live {
            smem::store_u32(table + 4 * e, before);
        }
        thread::sync_block();
    }
    if !live {
        return;
    }
    // SAFETY: the chunk's first expert's sum, in the table.
    let chunk_first = unsafe { smem::load_u32(table + 4 * (e - e % p.per_peer)) };
    let (start, sent) = p.place(e, count, before - chunk_first);
    let groups = if p.masked != 0 {
        sent
    } else {
        (before + count).min(p.capacity)
    };
    // SAFETY: expert `e`'s words; the groups where given.
    unsafe {
        global::store_u32_if(p.start + 4 * e as u64, start, true);
        global::store_u32_if(p.sent + 4 * e as u64, sent, true);
        global::store_u32_if(p.groups + 4 * e as u64, groups, p.groups != 0);
    }
}

/// # Safety
/// `p` as [`Pack`] says; blocks of [`MOE_THREADS`].
#[unsafe(export_name = "moe_pack")]
unsafe extern "ptx-kernel" fn pack(p: Pack) {
    each_block(p.entries, |i| {
        let at = 4 * i as u64;
        // SAFETY: entry `i`'s words; the expert's where in range.
        let slot = unsafe {
            let e = load_i32(p.chosen + at) as u32;
            if e >= p.experts {
                -1
            } else {
                let rank = load_i32(p.rank + at);
                let sent = load_i32(p.sent + 4 * e as u64);
                if rank < sent {
                    load_i32(p.start + 4 * e as u64) + rank
                } else {
                    -1
                }
            }
        };
        // SAFETY: entry `i`'s slot.
        unsafe { global::store_u32_if(p.slot + at, slot as u32, thread::thread_x() == 0) };
        if slot >= 0 {
            let (token, d) = (i / p.top_k, slot as u32);
            // SAFETY: the token's row and the entry's destination row, of `row_bytes` each.
            unsafe {
                copy_row(
                    p.src_codes + token as u64 * p.row_bytes as u64,
                    p.dst_codes + d as u64 * p.row_bytes as u64,
                    p.row_bytes,
                );
                copy_scales(
                    (p.src_scales, p.src_scale, token),
                    (p.dst_scales, p.dst_scale, d),
                    (p.dst_scales2, p.dst_scale2),
                );
            }
        }
    });
}

/// # Safety
/// `p` as [`RegroupPlan`] says; one block of `world · per_peer` threads rounded up to 32, with
/// `(32 + 2 · world · per_peer)` words of shared memory.
#[unsafe(export_name = "moe_regroup_plan")]
unsafe extern "ptx-kernel" fn regroup_plan(p: RegroupPlan) {
    let t = thread::thread_x();
    let pairs = p.world * p.per_peer;
    let live = t < pairs;
    let scratch = smem::dynamic_base();
    let (by_peer, by_expert) = (scratch + 128, scratch + 128 + 4 * pairs);
    // SAFETY: pair `i`'s count.
    let sent = |i: u32| unsafe { load_i32(p.sent + 4 * i as u64) }.max(0) as u32;
    // Thread t is pair (peer t / per_peer, expert t % per_peer) for the chunks' order, and pair
    // (peer t % world, expert t / world) for the groups' order.
    let (s, le) = (t % p.world, t / p.world);
    let mine = if live { sent(t) } else { 0 };
    let theirs = if live { sent(s * p.per_peer + le) } else { 0 };
    // SAFETY: the block's scratch; every thread calls both.
    let (in_chunk, _) = unsafe { block_exclusive_sum(mine, scratch) };
    let (in_groups, _) = unsafe { block_exclusive_sum(theirs, scratch) };
    // SAFETY: both tables hold `pairs` words.
    unsafe {
        if live {
            smem::store_u32(by_peer + 4 * t, in_chunk);
            smem::store_u32(by_expert + 4 * t, in_groups);
        }
        thread::sync_block();
    }
    if !live {
        return;
    }
    // SAFETY: the tables' entries of the segments' first pairs.
    let (chunk_first, expert_first) = unsafe {
        (
            smem::load_u32(by_peer + 4 * (t - t % p.per_peer)),
            smem::load_u32(by_expert + 4 * (le * p.world)),
        )
    };
    let masked = p.group_capacity != 0;
    let dst = if masked {
        le * p.group_capacity + in_groups - expert_first
    } else {
        in_groups
    };
    let last = s == p.world - 1;
    let group = if masked {
        (in_groups + theirs - expert_first).min(p.group_capacity)
    } else {
        in_groups + theirs
    };
    // SAFETY: pair t's words, pair (s, le)'s, expert le's.
    unsafe {
        global::store_u32_if(p.src_start + 4 * t as u64, in_chunk - chunk_first, true);
        global::store_u32_if(p.dst_start + 4 * (s * p.per_peer + le) as u64, dst, true);
        global::store_u32_if(p.groups + 4 * le as u64, group, last);
    }
}

/// # Safety
/// `p` as [`Regroup`] says; blocks of [`MOE_THREADS`].
#[unsafe(export_name = "moe_regroup")]
unsafe extern "ptx-kernel" fn regroup(p: Regroup) {
    each_block(p.world * p.capacity, |row| {
        let (s, j) = (row / p.capacity, row % p.capacity);
        let pair = |le: u32| (4 * (s * p.per_peer + le)) as u64;
        // SAFETY: pair words of peer `s`.
        let start = |le: u32| unsafe { load_i32(p.src_start + pair(le)) } as u32;
        let last = p.per_peer - 1;
        // SAFETY: as above.
        let total = start(last) + unsafe { load_i32(p.sent + pair(last)) }.max(0) as u32;
        if j >= total {
            return;
        }
        // The last expert whose rows start at or before j (empty experts before it share its
        // start; those after it start past j).
        let (mut lo, mut hi) = (0, p.per_peer);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if start(mid) <= j {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        // SAFETY: pair (s, lo)'s destination.
        let d = unsafe { load_i32(p.dst_start + pair(lo)) } as u32 + j - start(lo);
        let fits = p.group_capacity == 0 || d < (lo + 1) * p.group_capacity;
        let (chunk, group) = (row as u64, d as u64);
        let bytes = p.row_bytes as u64;
        // SAFETY: chunk row `row` and grouped row `d` (where it fits) hold `row_bytes` each.
        unsafe {
            if p.to_groups != 0 {
                if fits {
                    copy_row(
                        p.chunk_rows + chunk * bytes,
                        p.group_rows + group * bytes,
                        p.row_bytes,
                    );
                    copy_scales(
                        (p.chunk_scales, p.chunk_scale, row),
                        (p.group_scales, p.group_scale, d),
                        (p.group_scales2, p.group_scale2),
                    );
                }
            } else {
                let src = if fits {
                    p.group_rows + group * bytes
                } else {
                    0
                };
                copy_row(src, p.chunk_rows + chunk * bytes, p.row_bytes);
            }
        }
    });
}

/// # Safety
/// `p` as [`SwigluQuantize`] says; blocks of [`MOE_THREADS`].
#[unsafe(export_name = "moe_swiglu_quantize")]
unsafe extern "ptx-kernel" fn swiglu_quantize(p: SwigluQuantize) {
    let lane = thread::thread_x() % 32;
    let blocks = p.cols / 128;
    let units = blocks.div_ceil(SWIGLU_BLOCKS);
    each_warp(p.rows * units, |unit| {
        let (r, first) = (unit / units, (unit % units) * SWIGLU_BLOCKS);
        // SAFETY: group values `0..group_count`.
        let read = |g: u32| unsafe { load_i32(p.groups + 4 * g as u64) };
        if !row_in_groups(r, (p.group_count, p.group_capacity), read) {
            return;
        }
        let row = p.src + 2 * (r as u64 * 2 * p.cols as u64);
        let raw: [[f32; 4]; SWIGLU_BLOCKS as usize] = core::array::from_fn(|b| {
            let cb = first + b as u32;
            // SAFETY: four gate/up pairs of row r, 16 bytes at an aligned offset, where the
            // block is in the row.
            if cb < blocks {
                unsafe { global::load_f32x4(row + 2 * 2 * (cb * 128 + lane * 4) as u64) }
            } else {
                [0.0; 4]
            }
        });
        for (b, raw) in raw.iter().enumerate() {
            let cb = first + b as u32;
            if cb >= blocks {
                break;
            }
            let v = core::array::from_fn::<f32, 4, _>(|i| {
                let w = raw[i].to_bits();
                let (gate, up) = (f32::from_bits(w << 16), f32::from_bits(w & 0xFFFF_0000));
                activate(Activation::SwiGlu as u32, gate) * up
            });
            let m = thread::warp_max_u32(v.iter().fold(0, |m, &x| m.max(magnitude_bits(x))));
            let (scale, q) = Quotient::fp8_block(ElemType::E4M3, m);
            let codes = encode4(ElemType::E4M3, v, q);
            let col = cb * 128 + lane * 4;
            // SAFETY: row r's four codes at `col`, and its block's scale.
            unsafe {
                global::store_u32_if(p.codes + r as u64 * p.cols as u64 + col as u64, codes, true);
                global::store_u32_if(p.scales + 4 * p.scale.index(r, cb), scale, lane == 0);
                let second = lane == 0 && p.scales2 != 0;
                global::store_u32_if(p.scales2 + 4 * p.scale2.index(r, cb), scale, second);
            }
        }
    });
}

/// # Safety
/// `p` as [`Combine`] says; blocks of [`MOE_THREADS`].
#[unsafe(export_name = "moe_combine")]
unsafe extern "ptx-kernel" fn combine(p: Combine) {
    each_block(p.tokens, |t| {
        let mut c = thread::thread_x() * 8;
        while c < p.hidden {
            let mut acc = [0.0f32; 8];
            for j in 0..p.top_k {
                let at = 4 * (t * p.top_k + j) as u64;
                // SAFETY: entry (t, j)'s slot and weight; the slot's row where placed.
                unsafe {
                    let slot = load_i32(p.slot + at);
                    if slot >= 0 {
                        let w = global::load_f32_nc(p.weights + at);
                        let row = p.rows + 2 * (slot as u64 * p.hidden as u64 + c as u64);
                        let raw = global::load_f32x4(row).map(f32::to_bits);
                        for (i, a) in acc.iter_mut().enumerate() {
                            let word = raw[i / 2];
                            let bits = if i % 2 == 0 {
                                word << 16
                            } else {
                                word & 0xFFFF_0000
                            };
                            *a = math::fma(w, f32::from_bits(bits), *a);
                        }
                    }
                }
            }
            let o = t as u64 * p.hidden as u64 + c as u64;
            // SAFETY: token t's eight outputs at column c.
            unsafe {
                if p.out_f32 != 0 {
                    global::store_f32x4(p.out + 4 * o, [acc[0], acc[1], acc[2], acc[3]]);
                    global::store_f32x4(p.out + 4 * o + 16, [acc[4], acc[5], acc[6], acc[7]]);
                } else {
                    let w = core::array::from_fn::<u32, 4, _>(|i| {
                        convert::f32x2_to_bf16x2(acc[2 * i], acc[2 * i + 1])
                    });
                    global::store_u32x4_if(p.out + 2 * o, w, true);
                }
            }
            c += 8 * MOE_THREADS;
        }
    });
}
