//! Grouped GEMM timings (mixture of experts): our one grouped launch against what a user without
//! a grouped kernel does, a loop of cuBLASLt calls, one per group, timed in the same run.
//! The peer for FP8 blockwise experts is cuBLASLt's blockwise FP8 (1×128 / 128×128 scales); for
//! the other formats cuBLASLt bf16 on the groups' shapes.

use std::sync::Arc;

use blockscaled::{Gpu, GroupLayout, OutType, Recipe, ScaledMatrix};
use cudarc::driver::{CudaSlice, CudaStream};

use crate::cublaslt::{LtPeer, blk128_len, vec128_len};
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
}

/// Medians of one grouped case.
#[derive(Clone, Debug)]
pub struct GroupedOutcome {
    pub ours: Timing,
    pub peer: Option<Timing>,
    pub plan: String,
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
    let vb = random_values(c.seed ^ 0x5DEE_CE66_D1CE_4E5B, g * c.n * c.k, c.k);
    let a = ScaledMatrix::quantize(&va, rows, c.k, a_batch, c.recipe.a()).map_err(e)?;
    let b = ScaledMatrix::quantize(&vb, c.n, c.k, g, c.recipe.b()).map_err(e)?;
    let (da, db) = (gpu.upload(&a).map_err(e)?, gpu.upload(&b).map_err(e)?);
    let values: Vec<i32> = match c.layout {
        GroupLayout::Contiguous => c
            .sizes
            .iter()
            .scan(0usize, |acc, s| {
                *acc += s;
                Some(*acc as i32)
            })
            .collect(),
        GroupLayout::Masked => c.sizes.iter().map(|&s| s as i32).collect(),
    };
    let groups = match c.layout {
        GroupLayout::Contiguous => gpu.group_ends(&values),
        GroupLayout::Masked => gpu.group_counts(&values),
    }
    .map_err(e)?;
    let mut out = gpu.output(rows, c.n, a_batch, OutType::Bf16).map_err(e)?;
    let plan = gpu.grouped_plan(&da, &db, &groups).map_err(e)?;
    let ours = time_on_stream(gpu.stream(), c.warmup, c.iters, |_| {
        gpu.grouped_gemm_with(&da, &db, &groups, &mut out, plan)
    })
    .map_err(e)?;
    let peer = match peer {
        Some(p) => Some(time_peer(p, c).map_err(|x| format!("cuBLASLt: {x}"))?),
        None => None,
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
        flops,
        min_bytes,
    })
}

/// Per-group device buffers of the peer (random finite values): e4m3 codes with their scales,
/// or bf16.
struct PeerGroup {
    m: usize,
    fp8: Option<[CudaSlice<u8>; 2]>,
    scales: [CudaSlice<f32>; 2],
    bf16: Option<[CudaSlice<u16>; 2]>,
    c: CudaSlice<u16>,
}

/// The peer's loop: one cuBLASLt call per non-empty group, on buffers of that group's shape.
fn time_peer(p: &LtPeer, c: &GroupedCase) -> Result<Timing, String> {
    let s: &Arc<CudaStream> = p.stream();
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let fp8 = c.recipe == Recipe::DeepSeekFp8;
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
    let mut groups = Vec::new();
    for (i, &m) in c.sizes.iter().enumerate().filter(|(_, m)| **m > 0) {
        let seed = c.seed.wrapping_add(i as u64 * 7919);
        let (la, lb) = (m * c.k, c.n * c.k);
        groups.push(PeerGroup {
            m,
            fp8: if fp8 {
                Some([
                    s.clone_htod(&codes(seed, la)).map_err(e)?,
                    s.clone_htod(&codes(seed ^ 1, lb)).map_err(e)?,
                ])
            } else {
                None
            },
            scales: [
                s.clone_htod(&vec![1f32; vec128_len(m, c.k)]).map_err(e)?,
                s.clone_htod(&vec![1f32; blk128_len(c.n, c.k)]).map_err(e)?,
            ],
            bf16: if fp8 {
                None
            } else {
                Some([
                    s.clone_htod(&halves(seed, la)).map_err(e)?,
                    s.clone_htod(&halves(seed ^ 1, lb)).map_err(e)?,
                ])
            },
            c: s.alloc_zeros::<u16>(m * c.n).map_err(e)?,
        });
    }
    let (n, k) = (c.n, c.k);
    time_on_stream(s, c.warmup, c.iters, |_| -> Result<(), Msg> {
        for g in groups.iter_mut() {
            match (&g.fp8, &g.bf16) {
                (Some([a, b]), _) => {
                    let [sa, sb] = &g.scales;
                    p.gemm_fp8_blockwise(g.m, n, k, a, sa, b, sb, &mut g.c)
                }
                (_, Some([a, b])) => p.gemm_bf16(g.m, n, k, a, b, &mut g.c),
                _ => unreachable!("every group has one kind of buffers"),
            }
            .map_err(|x| Msg(x.to_string()))?;
        }
        Ok(())
    })
    .map_err(|m| m.0)
}

/// An error as text (the timing loop needs `From<DriverError>`).
struct Msg(String);

impl From<cudarc::driver::DriverError> for Msg {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Msg(e.to_string())
    }
}
