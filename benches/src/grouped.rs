//! Grouped GEMM timings (mixture of experts): our one grouped launch against what a user without
//! a grouped kernel does, a loop of cuBLASLt calls, one per group, timed in the same run.
//! The peer for FP8 blockwise experts is cuBLASLt's blockwise FP8 (1×128 / 128×128 scales); for
//! the other formats cuBLASLt bf16 on the groups' shapes.

use std::sync::Arc;

use blockscaled::Call;
use blockscaled::{Gpu, GroupLayout, OutType, Plan, Recipe, ScaledMatrix};
use cudarc::driver::{CudaSlice, CudaStream};

use crate::cublaslt::{LtPeer, blk128_len, vec128_len};
use crate::report::Entry;
use crate::timing::{Timing, time_on_stream};
use blockscaled_tests::random_values;

/// The seed's grouped cases (G groups of M rows each, N, K).
pub const SEED_CASES: [(&[usize], usize, usize); 4] = [
    (&[80, 176, 128, 72, 64, 248, 96, 160], 4096, 7168),
    (&[40, 76, 168, 72, 164, 148, 196, 160], 7168, 2048),
    (&[192, 320], 3072, 4096),
    (&[128, 384], 4096, 1536),
];

/// One grouped case.
#[derive(Clone, Debug)]
pub struct GroupedCase {
    pub recipe: Recipe,
    pub layout: GroupLayout,
    /// Rows per group (masked: the counts; capacity is `capacity`).
    pub sizes: Vec<usize>,
    pub capacity: usize,
    pub n: usize,
    pub k: usize,
    pub warmup: usize,
    pub iters: usize,
    pub seed: u64,
    /// Which of our plans runs.
    pub route: GroupedRoute,
    /// The FP8 kernel's tile instead of the plan's (plans on the FP8 kernel, folded or not).
    pub fp8_tile: Option<blockscaled::Sm90Tile>,
    /// The FP8 kernel's band height in M units instead of the plan's (as `fp8_tile`).
    pub fp8_group_m: Option<u32>,
    /// The FP8 kernel's cluster instead of the plan's (as `fp8_tile`).
    pub fp8_cluster: Option<blockscaled::ClusterShape>,
}

/// Which of our plans a grouped case times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupedRoute {
    /// `Gpu::grouped_gemm`'s choice.
    Chosen,
    /// The exact kernels (`plan::choose_grouped_exact`: no fold).
    Exact,
    /// Both operands folded per call where they are MX or NVFP4 (`Plan::Sm90MxFp8`).
    Fold,
    /// The experts folded to FP8 once before timing (`Gpu::fold_to_fp8`), as at model load;
    /// then `Gpu::grouped_gemm`'s choice.
    FoldedOnce,
}

/// Medians of one grouped case.
#[derive(Clone, Debug)]
pub struct GroupedOutcome {
    pub ours: Timing,
    pub peer: Option<Timing>,
    pub plan: String,
    /// Whether the plan runs on the FP8 kernel (FP8 experts, folded or not): its floor counts
    /// FLOPs at the FP8 MMA rate, else at bf16's.
    pub fp8_kernel: bool,
    /// Groups whose peer call ran on rows padded to a multiple of 16 (cuBLASLt has no blockwise
    /// FP8 algorithm for some M, e.g. 37), or on bf16 where no padding helped.
    pub peer_padded: usize,
    pub peer_bf16: usize,
    /// Useful FLOPs (2·Σ M_g·N·K) and the bytes every expert with rows must read at least once.
    pub flops: f64,
    pub min_bytes: f64,
}

/// Times `c`: ours on one set of operands (the experts' weights are far larger than L2), and the
/// peer's loop of one cuBLASLt call per non-empty group.
pub fn run_grouped(
    gpu: &Gpu,
    peer: Option<&LtPeer>,
    c: &GroupedCase,
) -> Result<GroupedOutcome, String> {
    let e = |x: blockscaled::Error| x.to_string();
    let g = c.sizes.len();
    let total: usize = c.sizes.iter().sum();
    let (rows, a_batch) = match c.layout {
        GroupLayout::Contiguous => (total.max(1), 1),
        GroupLayout::Masked => (c.capacity, g),
    };
    let va = random_values(c.seed, rows * a_batch * c.k, c.k);
    let a = ScaledMatrix::quantize(&va, rows, c.k, a_batch, c.recipe.a()).map_err(e)?;
    let b = experts(c, g).map_err(e)?;
    let (da, mut db) = (gpu.upload(&a).map_err(e)?, gpu.upload(&b).map_err(e)?);
    if c.route == GroupedRoute::FoldedOnce {
        db = gpu.fold_to_fp8(&db, true).map_err(e)?;
    }
    let groups = upload_groups(gpu, c.layout, &c.sizes).map_err(e)?;
    let mut out = gpu.output(rows, c.n, a_batch, OutType::Bf16).map_err(e)?;
    let problem = blockscaled::plan::GroupedProblem {
        arch: gpu.arch(),
        hw: gpu.hardware(),
        shape: blockscaled::GemmShape {
            m: rows,
            n: c.n,
            k: c.k,
            l: a_batch,
        },
        a: da.desc(),
        b: db.desc(),
        groups: g,
    };
    let plan = match c.route {
        GroupedRoute::Exact => blockscaled::plan::choose_grouped_exact(&problem).map_err(e)?,
        GroupedRoute::Fold => Plan::Sm90MxFp8(problem.fp8_config()),
        _ => gpu.grouped_plan(&da, &db, &groups).map_err(e)?,
    };
    let force = |cfg: blockscaled::Sm90Config| {
        let cfg = c.fp8_tile.map_or(cfg, |t| cfg.with_tile(t));
        let cfg = c.fp8_cluster.map_or(cfg, |cl| cfg.with_cluster(cl));
        c.fp8_group_m.map_or(cfg, |g| cfg.with_group_m(g))
    };
    let plan = match plan {
        Plan::Sm90Fp8(cfg) => Plan::Sm90Fp8(force(cfg)),
        Plan::Sm90MxFp8(cfg) => Plan::Sm90MxFp8(force(cfg)),
        p => p,
    };
    let ours = time_on_stream(gpu.stream(), c.warmup, c.iters, |_| {
        gpu.run(
            &Call::new(&da, &db).groups(&groups).with_plan(plan),
            &mut out,
        )
    })
    .map_err(e)?;
    let (peer, peer_padded, peer_bf16) = match peer {
        Some(p) => {
            let (t, padded, bf16) = time_peer(p, c).map_err(|x| format!("cuBLASLt: {x}"))?;
            (Some(t), padded, bf16)
        }
        None => (None, 0, 0),
    };
    let busy = c.sizes.iter().filter(|&&s| s > 0).count();
    let flops = 2.0 * total as f64 * c.n as f64 * c.k as f64;
    let b_bytes = b.data().len() + b.scales().len();
    let a_bytes =
        (a.data().len() + a.scales().len()) as f64 * total as f64 / (rows * a_batch) as f64;
    let min_bytes =
        b_bytes as f64 * busy as f64 / g as f64 + a_bytes + total as f64 * c.n as f64 * 2.0;
    Ok(GroupedOutcome {
        ours,
        peer,
        plan: crate::cases::plan_name(&plan),
        fp8_kernel: matches!(plan, Plan::Sm90Fp8(_) | Plan::Sm90MxFp8(_)),
        peer_padded,
        peer_bf16,
        flops,
        min_bytes,
    })
}

/// Groups of `sizes` rows on `gpu`: each group's end row (contiguous) or its count (masked).
pub fn upload_groups(
    gpu: &Gpu,
    layout: GroupLayout,
    sizes: &[usize],
) -> blockscaled::Result<blockscaled::DeviceGroups<'static>> {
    match layout {
        GroupLayout::Contiguous => {
            let ends: Vec<i32> = sizes
                .iter()
                .scan(0usize, |acc, s| {
                    *acc += s;
                    Some(*acc as i32)
                })
                .collect();
            gpu.group_ends(&ends)
        }
        GroupLayout::Masked => {
            let counts: Vec<i32> = sizes.iter().map(|&s| s as i32).collect();
            gpu.group_counts(&counts)
        }
    }
}

/// The G experts: copies of one random expert (quantizing G × N × K values on the CPU takes
/// minutes at G = 32; the time of a GEMM does not depend on the values, and each copy is read
/// from its own memory).
fn experts(c: &GroupedCase, g: usize) -> blockscaled::Result<ScaledMatrix> {
    let v = random_values(c.seed ^ 0x5DEE_CE66_D1CE_4E5B, c.n * c.k, c.k);
    repeated(&ScaledMatrix::quantize(&v, c.n, c.k, 1, c.recipe.b())?, g)
}

/// `g` batch entries, each a copy of `one`'s first.
pub fn repeated(one: &ScaledMatrix, g: usize) -> blockscaled::Result<ScaledMatrix> {
    let d = *one.desc();
    let per = d.scale_layout.required_len(1).expect("one batch entry") * d.format.scale.bytes();
    let data = d.data_bytes().expect("a valid matrix") / d.batch;
    let layout = d.scale_layout;
    ScaledMatrix::from_parts(
        d.format,
        d.rows,
        d.k,
        g,
        one.data()[..data].repeat(g),
        one.scales()[..per].repeat(g),
        blockscaled::ScaleLayout {
            batch_stride: layout.required_len(1).expect("one batch entry"),
            ..layout
        },
        d.tensor_scale,
    )
}

/// Per-group device buffers of the peer (random finite values) and its output.
struct PeerGroup {
    m: usize,
    operands: PeerOperands,
    c: CudaSlice<u16>,
}

/// A and B of one peer call: e4m3 codes with their blockwise scales, or bf16.
enum PeerOperands {
    Fp8 {
        codes: [CudaSlice<u8>; 2],
        scales: [CudaSlice<f32>; 2],
    },
    Bf16([CudaSlice<u16>; 2]),
}

/// The peer's loop: one cuBLASLt call per non-empty group, on buffers of that group's shape.
/// A group whose M has no blockwise FP8 algorithm runs on its rows padded to a multiple of 16
/// (what a caller of cuBLASLt does), or in bf16 if that has none either; the counts of both
/// are returned with the timing.
fn time_peer(p: &LtPeer, c: &GroupedCase) -> Result<(Timing, usize, usize), String> {
    let s: &Arc<CudaStream> = p.stream();
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let want_fp8 = c.recipe == Recipe::DeepSeekFp8;
    // e4m3 codes of magnitude 0.5..1 with random signs, or bf16 values in ±1.
    let codes = |seed: u64, len: usize| -> Vec<u8> {
        let v = random_values(seed, len, 64);
        v.iter()
            .map(|x| 0x30 | (((x * 1e4) as i64 as u8) & 0x87))
            .collect()
    };
    let halves = |seed: u64, len: usize| -> Vec<u16> {
        let v = random_values(seed, len, 64);
        v.iter()
            .map(|x| half::bf16::from_f32(*x).to_bits())
            .collect()
    };
    let (n, k) = (c.n, c.k);
    let (mut groups, mut padded, mut bf16) = (Vec::new(), 0, 0);
    for (i, &m0) in c.sizes.iter().enumerate().filter(|(_, m)| **m > 0) {
        let seed = c.seed.wrapping_add(i as u64 * 7919);
        let mut found = None;
        if want_fp8 {
            for m in [m0, m0.next_multiple_of(16)] {
                let (la, lb) = (m * k, n * k);
                let mut g = PeerGroup {
                    m,
                    operands: PeerOperands::Fp8 {
                        codes: [
                            s.clone_htod(&codes(seed, la)).map_err(e)?,
                            s.clone_htod(&codes(seed ^ 1, lb)).map_err(e)?,
                        ],
                        scales: [
                            s.clone_htod(&vec![1f32; vec128_len(m, k)]).map_err(e)?,
                            s.clone_htod(&vec![1f32; blk128_len(n, k)]).map_err(e)?,
                        ],
                    },
                    c: s.alloc_zeros::<u16>(m * n).map_err(e)?,
                };
                if call(p, &mut g, n, k).is_ok() {
                    padded += (m != m0) as usize;
                    found = Some(g);
                    break;
                }
            }
        }
        let g = match found {
            Some(g) => g,
            None => {
                bf16 += want_fp8 as usize;
                let m = m0;
                PeerGroup {
                    m,
                    operands: PeerOperands::Bf16([
                        s.clone_htod(&halves(seed, m * k)).map_err(e)?,
                        s.clone_htod(&halves(seed ^ 1, n * k)).map_err(e)?,
                    ]),
                    c: s.alloc_zeros::<u16>(m * n).map_err(e)?,
                }
            }
        };
        groups.push(g);
    }
    let t = time_on_stream(s, c.warmup, c.iters, |_| -> Result<(), Msg> {
        for g in groups.iter_mut() {
            call(p, g, n, k).map_err(|x| Msg(x.to_string()))?;
        }
        Ok(())
    })
    .map_err(|m| m.0)?;
    Ok((t, padded, bf16))
}

/// One group's cuBLASLt call.
fn call(p: &LtPeer, g: &mut PeerGroup, n: usize, k: usize) -> crate::cublaslt::Result<()> {
    match &g.operands {
        PeerOperands::Fp8 {
            codes: [a, b],
            scales: [sa, sb],
        } => p.gemm_fp8_blockwise(g.m, n, k, a, sa, b, sb, &mut g.c),
        PeerOperands::Bf16([a, b]) => p.gemm_bf16(g.m, n, k, a, b, &mut g.c),
    }
}

/// An error as text (the timing loop needs `From<DriverError>`).
struct Msg(String);

impl From<cudarc::driver::DriverError> for Msg {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Msg(e.to_string())
    }
}

/// The columns of [`grouped_line`].
pub fn grouped_header() -> String {
    format!(
        "{:<14} {:<10} {:>3} {:>6} {:>6} {:>6} {:<34} {:>9} {:>8} {:>7} {:>9} {:>6}",
        "recipe",
        "layout",
        "G",
        "rows",
        "N",
        "K",
        "plan",
        "ours µs",
        "TFLOP/s",
        "floor×",
        "peer µs",
        "ratio"
    )
}

/// One case's line: our median, TFLOP/s, time over the floor, the peer's median and
/// peer / ours. The floor: the bytes at the 3.0 TB/s copy ceiling measured here, or the FLOPs
/// at the MMA's rate (FP8 1.2 PFLOP/s dense as measured, for plans on the FP8 kernel; bf16 0.7
/// for the kernels that convert to bf16), whichever is longer.
pub fn grouped_line(c: &GroupedCase, o: &GroupedOutcome) -> String {
    let us = o.ours.median_ms * 1e3;
    let rate = if o.fp8_kernel { 1.2e15 } else { 0.7e15 };
    let floor = (o.min_bytes / 3.0e12).max(o.flops / rate) * 1e6;
    let (peer_us, ratio) = match &o.peer {
        Some(p) => (
            format!("{:.1}", p.median_ms * 1e3),
            format!("{:.2}", p.median_ms * 1e3 / us),
        ),
        None => ("-".into(), "-".into()),
    };
    let peer_note = match (o.peer_padded, o.peer_bf16) {
        (0, 0) => String::new(),
        (p, b) => format!(" (peer: {p} groups padded to 16 rows, {b} in bf16)"),
    };
    let plan = match c.route {
        GroupedRoute::FoldedOnce => format!("B folded once; {}", o.plan),
        _ => o.plan.clone(),
    };
    format!(
        "{:<14} {:<10} {:>3} {:>6} {:>6} {:>6} {:<34} {:>9.1} {:>8.1} {:>7.2} {:>9} {:>6}{}",
        c.recipe.name(),
        format!("{:?}", c.layout),
        c.sizes.len(),
        c.sizes.iter().sum::<usize>(),
        c.n,
        c.k,
        plan,
        us,
        o.flops / (us * 1e-6) / 1e12,
        us / floor,
        peer_us,
        ratio,
        peer_note
    )
}

/// The case as a record ([`crate::report`]): M the rows summed over the groups, L the groups;
/// the useful FLOPs and the bytes every expert with rows must read at least; the peer the loop
/// of cuBLASLt calls.
pub fn grouped_entry(c: &GroupedCase, o: &GroupedOutcome) -> Entry {
    let layout = match c.layout {
        GroupLayout::Contiguous => "contiguous".to_string(),
        GroupLayout::Masked => format!("masked, capacity {}", c.capacity),
    };
    let route = match c.route {
        GroupedRoute::Chosen => "",
        GroupedRoute::Exact => ", exact kernels",
        GroupedRoute::Fold => ", folded per call",
        GroupedRoute::FoldedOnce => ", B folded once",
    };
    // The rows of each group where they fit in a cell, else the largest.
    let sizes = if c.sizes.len() <= 8 {
        format!("{:?}", c.sizes).replace(' ', "")
    } else {
        format!("≤{} rows", c.sizes.iter().max().unwrap_or(&0))
    };
    let name = format!("{} {layout}{route} {sizes}", c.recipe.name());
    let peer = if c.recipe == Recipe::DeepSeekFp8 {
        "cuBLASLt fp8 1x128/128x128 loop"
    } else {
        "cuBLASLt bf16 loop"
    };
    let total = c.sizes.iter().sum::<usize>();
    let row = crate::report::row(
        name,
        (total, c.n, c.k, c.sizes.len()),
        (o.ours.median_ms, o.flops, o.min_bytes),
        o.peer.map(|t| (peer, t.median_ms)),
    );
    let e = Entry::new("grouped", row).plan(o.plan.clone());
    match (o.peer_padded, o.peer_bf16) {
        (0, 0) => e,
        (p, b) => e.note(format!("peer: {p} groups padded to 16 rows, {b} in bf16")),
    }
}

/// `cargo bench`'s grouped set: the seed's four cases in FP8 blockwise, MXFP4 experts with FP8
/// activations (chosen plan, exact kernel, experts folded once) and NVFP4 pairs (chosen = exact
/// plan, experts folded once), and masked
/// decode (G = 8 and 32, capacity 256, random counts up to 64) in FP8 blockwise.
pub fn bench_cases() -> Vec<GroupedCase> {
    let mut cases = Vec::new();
    let case = |recipe, layout, sizes: Vec<usize>, capacity, n, k, route, seed| GroupedCase {
        recipe,
        layout,
        sizes,
        capacity,
        n,
        k,
        warmup: 3,
        iters: 20,
        seed,
        route,
        fp8_tile: None,
        fp8_group_m: None,
        fp8_cluster: None,
    };
    let recipes = [
        Recipe::DeepSeekFp8,
        Recipe::W4A8(blockscaled::Fp4Weights::Mxfp4),
        Recipe::Nvfp4,
    ];
    for (i, recipe) in recipes.into_iter().enumerate() {
        // Each route once: NVFP4's chosen plan is the exact MX kernel.
        let routes: &[GroupedRoute] = match recipe {
            Recipe::DeepSeekFp8 => &[GroupedRoute::Chosen],
            Recipe::Nvfp4 => &[GroupedRoute::Chosen, GroupedRoute::FoldedOnce],
            _ => &[
                GroupedRoute::Chosen,
                GroupedRoute::Exact,
                GroupedRoute::FoldedOnce,
            ],
        };
        for &route in routes {
            for (j, (sizes, n, k)) in SEED_CASES.iter().enumerate() {
                let seed = 7000 + (i * 10 + j) as u64;
                let layout = GroupLayout::Contiguous;
                cases.push(case(recipe, layout, sizes.to_vec(), 0, *n, *k, route, seed));
            }
        }
    }
    for (g, seed) in [(8usize, 7100u64), (32, 7101)] {
        let counts = decode_counts(g, 64, seed);
        for (n, k) in [(4096, 7168), (7168, 2048)] {
            let (recipe, route) = (Recipe::DeepSeekFp8, GroupedRoute::Chosen);
            cases.push(case(
                recipe,
                GroupLayout::Masked,
                counts.clone(),
                256,
                n,
                k,
                route,
                seed,
            ));
        }
    }
    cases
}

/// Random decode-like counts: `g` groups of 0..=`max` rows (a router's top-k over a batch).
pub fn decode_counts(g: usize, max: usize, seed: u64) -> Vec<usize> {
    random_values(seed, g, g)
        .iter()
        .map(|v| ((v.abs() * 1e4) as usize) % (max + 1))
        .collect()
}
