//! Block-sparse GEMM cases: a pattern of stored blocks at a density — 128 × 128 FP8 blocks with
//! their scales, or 64 × 64 / 128 × 128 bf16 or fp16 blocks — timed against our dense kernel of
//! the same type and cuBLASLt's dense GEMM (blockwise FP8, bf16 or fp16) on the same shape, in
//! the same run (the target: time ≤ 1.2 × density × dense + 3 µs, dense being our FP8
//! kernel or cuBLASLt of the 16-bit type).

use blockscaled::Call;
use blockscaled::{
    BsrMatrix, ElemType, Fp4Weights, Gpu, OperandFormat, OutType, Plan, Recipe, ScaledMatrix,
    SparseSide,
};
use cudarc::driver::CudaSlice;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cublaslt::{LtPeer, blk128_len, vec128_len};
use crate::report::Entry;
use crate::timing::{Timing, time_on_stream};
use blockscaled_tests::random_values;

/// Which blocks are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Each block with probability `density` (seeded).
    Random,
    /// Each block row the same number of consecutive blocks around the diagonal.
    Banded,
    /// ⌈1 / density⌉ diagonal groups of block rows × block columns (mixture of experts as one
    /// block-diagonal matrix).
    BlockDiagonal,
}

impl Pattern {
    pub fn from_name(s: &str) -> Option<Pattern> {
        match s {
            "random" => Some(Pattern::Random),
            "banded" => Some(Pattern::Banded),
            "block-diagonal" => Some(Pattern::BlockDiagonal),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Random => "random",
            Pattern::Banded => "banded",
            Pattern::BlockDiagonal => "block-diagonal",
        }
    }

    /// Whether block (r, c) of `rows` × `cols` blocks is stored.
    pub fn mask(self, rows: usize, cols: usize, density: f64, seed: u64) -> Vec<bool> {
        let mut rng = StdRng::seed_from_u64(seed);
        let per_row = ((density * cols as f64).round() as usize).clamp(0, cols);
        let groups = (1.0 / density.max(1e-9)).round().max(1.0) as usize;
        let mut keep = vec![false; rows * cols];
        for r in 0..rows {
            for c in 0..cols {
                keep[r * cols + c] = match self {
                    Pattern::Random => rng.random_bool(density.clamp(0.0, 1.0)),
                    Pattern::Banded => {
                        let centre = r * cols / rows;
                        let first = centre.saturating_sub(per_row / 2).min(cols - per_row);
                        (first..first + per_row).contains(&c)
                    }
                    Pattern::BlockDiagonal => {
                        r * groups.min(rows) / rows == c * groups.min(rows) / cols
                    }
                };
            }
        }
        keep
    }
}

/// The blocks' type: DeepSeek-style FP8 (e4m3, one fp32 scale per 128 × 128 block; the dense
/// operand with 1 × 128 scales), or bf16 or fp16 (both operands).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BsrType {
    Fp8,
    Bf16,
    F16,
}

impl BsrType {
    pub fn from_name(s: &str) -> Option<BsrType> {
        match s {
            "fp8" | "e4m3" => Some(BsrType::Fp8),
            "bf16" => Some(BsrType::Bf16),
            "f16" | "fp16" => Some(BsrType::F16),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            BsrType::Fp8 => "fp8",
            BsrType::Bf16 => "bf16",
            BsrType::F16 => "f16",
        }
    }

    /// The 16-bit element type of both operands (`None`: FP8).
    pub fn half(self) -> Option<ElemType> {
        match self {
            BsrType::Fp8 => None,
            BsrType::Bf16 => Some(ElemType::BF16),
            BsrType::F16 => Some(ElemType::F16),
        }
    }
}

/// One block-sparse case: C = A · Bᵀ with B (N × K) sparse, A (M × K) dense activations.
#[derive(Clone, Debug)]
pub struct BsrCase {
    pub ty: BsrType,
    /// Block size (FP8: 128; 16-bit: 64 or 128).
    pub block: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub density: f64,
    pub pattern: Pattern,
    pub side: SparseSide,
    pub warmup: usize,
    pub iters: usize,
    pub seed: u64,
    /// A forced plan (else the chosen one).
    pub plan: Option<Plan>,
}

/// What one case measured.
#[derive(Clone, Debug)]
pub struct BsrOutcome {
    pub sparse: Timing,
    pub dense: Timing,
    pub peer: Option<Timing>,
    pub nnz: usize,
    /// Stored blocks over all blocks.
    pub density: f64,
    pub plan: String,
    /// The dense time the target scales: our dense FP8 kernel, or cuBLASLt bf16 / fp16 (none without
    /// the peer).
    pub target_base: Option<Timing>,
    /// The bytes a call must move at least: the dense operand, the stored blocks with their
    /// scales and indices, the output.
    pub min_bytes: f64,
}

impl BsrOutcome {
    /// The bound: 1.2 × density × the dense time + 3 µs (ms; infinite without a base).
    pub fn target_ms(&self) -> f64 {
        self.target_base
            .map_or(f64::INFINITY, |t| 1.2 * self.density * t.median_ms + 3e-3)
    }
}

/// The case's operands from `seed`: the dense one, the sparse one's full matrix, and its blocks
/// kept by the pattern (FP8: a random matrix with 128 × 128 scales; 16-bit: random values of the
/// type).
pub fn case_operands(
    c: &BsrCase,
    seed: u64,
) -> Result<(ScaledMatrix, ScaledMatrix, BsrMatrix), String> {
    let e = |x: blockscaled::Error| x.to_string();
    let (dense_rows, sparse_rows) = match c.side {
        SparseSide::B => (c.m, c.n),
        SparseSide::A => (c.n, c.m),
    };
    let (fa, fb) = match c.ty.half() {
        None => (Recipe::DeepSeekFp8.a(), Recipe::DeepSeekFp8.b()),
        Some(elem) => {
            let f = OperandFormat {
                elem,
                ..Recipe::W4A16(Fp4Weights::Nvfp4).a()
            };
            (f, f)
        }
    };
    let va = random_values(seed, dense_rows * c.k, c.k);
    let dense = ScaledMatrix::quantize(&va, dense_rows, c.k, 1, fa).map_err(e)?;
    let vb = random_values(seed ^ 0x9E37, sparse_rows * c.k, c.k);
    let full = ScaledMatrix::quantize(&vb, sparse_rows, c.k, 1, fb).map_err(e)?;
    let bs = c.block;
    let (brs, bcs) = (sparse_rows.div_ceil(bs), c.k / bs);
    let mask = c.pattern.mask(brs, bcs, c.density, seed);
    let keep = |r: usize, col: usize| mask[r * bcs + col];
    let sparse = match c.ty.half() {
        None => BsrMatrix::from_dense_blocks(&full, keep),
        Some(elem) => {
            let bits: Vec<u16> = full
                .data()
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            BsrMatrix::from_dense_16bit(elem, &bits, (sparse_rows, c.k), bs, keep)
        }
    }
    .map_err(e)?;
    Ok((dense, full, sparse))
}

/// Runs one case: uploads the operands ([`case_operands`]), times ours, our dense kernel on the
/// full matrix, and cuBLASLt on the dense shape (blockwise FP8, bf16 or fp16).
pub fn run_bsr(gpu: &Gpu, peer: Option<&LtPeer>, c: &BsrCase) -> Result<BsrOutcome, String> {
    let e = |x: blockscaled::Error| x.to_string();
    let (dense_rows, sparse_rows) = match c.side {
        SparseSide::B => (c.m, c.n),
        SparseSide::A => (c.n, c.m),
    };
    let (dense, full, sparse) = case_operands(c, c.seed)?;
    let (dd, ds) = (
        gpu.upload(&dense).map_err(e)?,
        gpu.upload_bsr(&sparse).map_err(e)?,
    );
    let (m, n) = (c.m, c.n);
    let mut out = gpu.output(m, n, 1, OutType::Bf16).map_err(e)?;
    let plan = match c.plan {
        Some(p) => p,
        None => gpu.bsr_plan(&dd, &ds).map_err(e)?,
    };
    let sparse_t = time_on_stream(gpu.stream(), c.warmup, c.iters, |_| {
        gpu.run(&Call::sparse(&dd, &ds, c.side).with_plan(plan), &mut out)
    })
    .map_err(e)?;
    // Dense: the same product with every block stored, on our dense kernel (with A sparse, as
    // Cᵀ = B · Aᵀ: FP8's dense A takes 1×128 scales, its B 128 × 128).
    let dfull = gpu.upload(&full).map_err(e)?;
    let mut dense_out = gpu
        .output(dense_rows, sparse_rows, 1, OutType::Bf16)
        .map_err(e)?;
    let dense_plan = gpu.plan(&dd, &dfull).map_err(e)?;
    let dense_t = time_on_stream(gpu.stream(), c.warmup, c.iters, |_| {
        gpu.gemm_with(&dd, &dfull, &mut dense_out, dense_plan)
    })
    .map_err(e)?;
    let peer_t = match peer {
        Some(p) if c.ty != BsrType::Fp8 || p.has_blockwise_modes() => {
            // C = A · Bᵀ as cuBLASLt sees it: with A sparse, A is the full sparse matrix.
            let (a, b) = match c.side {
                SparseSide::B => (&dense, &full),
                SparseSide::A => (&full, &dense),
            };
            Some(time_peer(p, c, (m, n), (a, b)).map_err(|x| x.to_string())?)
        }
        _ => None,
    };
    Ok(BsrOutcome {
        sparse: sparse_t,
        dense: dense_t,
        peer: peer_t,
        nnz: sparse.nnz(),
        density: sparse.density(),
        plan: crate::cases::plan_name(&plan),
        target_base: if c.ty != BsrType::Fp8 {
            peer_t
        } else {
            Some(dense_t)
        },
        min_bytes: (dense.data().len()
            + dense.scales().len()
            + sparse.values().len()
            + 4 * (sparse.scales().len()
                + sparse.crow_indices().len()
                + sparse.col_indices().len())
            + 2 * m * n) as f64,
    })
}

/// cuBLASLt's dense GEMM of the case's shape: blockwise FP8 (on constant codes and scales), or
/// bf16 / fp16 on the case's own codes `(a, b)` (A: m × K, B: n × K, every block stored). The
/// data matter: on constant operands the tensor cores draw less power and the clocks stay
/// higher; cuBLASLt bf16 at 4096³ took 157 µs on all-ones inputs against 180 µs on random ones
/// in the same run.
fn time_peer(
    p: &LtPeer,
    c: &BsrCase,
    (m, n): (usize, usize),
    (a, b): (&ScaledMatrix, &ScaledMatrix),
) -> crate::cublaslt::Result<Timing> {
    let s = p.stream();
    let k = c.k;
    let mut out: CudaSlice<u16> = s.alloc_zeros(m * n)?;
    if c.ty != BsrType::Fp8 {
        let codes = |x: &ScaledMatrix| -> Vec<u16> {
            x.data()
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect()
        };
        let (a, b): (CudaSlice<u16>, CudaSlice<u16>) =
            (s.clone_htod(&codes(a))?, s.clone_htod(&codes(b))?);
        return time_on_stream(s, c.warmup, c.iters, |_| {
            if c.ty == BsrType::Bf16 {
                p.gemm_bf16(m, n, k, &a, &b, &mut out)
            } else {
                p.gemm_f16(m, n, k, &a, &b, &mut out)
            }
        });
    }
    let codes = |len: usize| -> crate::cublaslt::Result<CudaSlice<u8>> {
        Ok(s.clone_htod(&vec![0x38u8; len])?)
    };
    let (a, b) = (codes(m * k)?, codes(n * k)?);
    let sa: CudaSlice<f32> = s.clone_htod(&vec![1f32; vec128_len(m, k)])?;
    let sb: CudaSlice<f32> = s.clone_htod(&vec![1f32; blk128_len(n, k)])?;
    time_on_stream(s, c.warmup, c.iters, |_| {
        p.gemm_fp8_blockwise(m, n, k, &a, &sa, &b, &sb, &mut out)
    })
}

/// The header of [`bsr_line`].
pub fn bsr_header() -> String {
    format!(
        "{:<9} {:<6} {:>5} {:>5} {:>5} {:<14} {:>6} {:>7} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6}  {}",
        "blocks",
        "side",
        "M",
        "N",
        "K",
        "pattern",
        "dens%",
        "blocks",
        "bsr µs",
        "dense µs",
        "cuBLASLt",
        "target µs",
        "TFLOP/s",
        "vs dense",
        "ok",
        "plan"
    )
}

/// One line: times (medians), useful TFLOP/s (2 · rows · stored blocks · block²), the ratio to
/// density × the target's dense time, and whether the target holds.
pub fn bsr_line(c: &BsrCase, o: &BsrOutcome) -> String {
    let other = match c.side {
        SparseSide::B => c.m,
        SparseSide::A => c.n,
    };
    let useful = 2.0 * other as f64 * o.nnz as f64 * (c.block * c.block) as f64;
    let ms = o.sparse.median_ms;
    let base = o.target_base.map_or(f64::NAN, |t| t.median_ms);
    let ratio = ms / (o.density * base);
    format!(
        "{:<9} {:<6} {:>5} {:>5} {:>5} {:<14} {:>6.1} {:>7} {:>10.1} {:>10.1} {:>10} {:>10.1} {:>8.0} {:>8.2} {:>6}  {}",
        format!("{}/{}", c.ty.name(), c.block),
        format!("{:?}", c.side),
        c.m,
        c.n,
        c.k,
        c.pattern.name(),
        100.0 * o.density,
        o.nnz,
        ms * 1e3,
        o.dense.median_ms * 1e3,
        o.peer
            .map(|t| format!("{:.1}", t.median_ms * 1e3))
            .unwrap_or_else(|| "-".into()),
        o.target_ms() * 1e3,
        useful / ms * 1e-9,
        ratio,
        if ms <= o.target_ms() { "yes" } else { "no" },
        o.plan
    )
}

/// The case as a record ([`crate::report`]): the stored blocks' FLOPs and the bytes a call must
/// move; the peer cuBLASLt's dense GEMM; our dense kernel's time and the target in the note.
pub fn bsr_entry(c: &BsrCase, o: &BsrOutcome) -> Entry {
    let other = match c.side {
        SparseSide::B => c.m,
        SparseSide::A => c.n,
    };
    let useful = 2.0 * other as f64 * o.nnz as f64 * (c.block * c.block) as f64;
    let name = format!(
        "{}/{} {:?} sparse, {} {:.1}%",
        c.ty.name(),
        c.block,
        c.side,
        c.pattern.name(),
        100.0 * c.density
    );
    let peer = match c.ty {
        BsrType::Fp8 => "cuBLASLt fp8 1x128/128x128 dense",
        BsrType::Bf16 => "cuBLASLt bf16 dense",
        BsrType::F16 => "cuBLASLt f16 dense",
    };
    let ms = o.sparse.median_ms;
    let row = crate::report::row(
        name,
        (c.m, c.n, c.k, 1),
        (ms, useful, o.min_bytes),
        o.peer.map(|t| (peer, t.median_ms)),
    );
    let note = format!(
        "our dense kernel {:.1} µs; target {:.1} µs ({}); {} blocks stored ({:.1}%)",
        o.dense.median_ms * 1e3,
        o.target_ms() * 1e3,
        if ms <= o.target_ms() { "met" } else { "missed" },
        o.nnz,
        100.0 * o.density
    );
    Entry::new("bsr", row).plan(o.plan.clone()).note(note)
}

/// The bench's cases: FP8 128 × 128 blocks, bf16 64 × 64 and 128 × 128 blocks and fp16 128 × 128
/// blocks (the seed's type); 4096³ and
/// 8192³, random and banded, densities 5 / 10 / 25 / 50 / 100 %, B sparse; block-diagonal at
/// 4096³; and A sparse at 4096³ (10 %, 50 %).
pub fn bench_cases(warmup: usize, iters: usize) -> Vec<BsrCase> {
    let mut cases = Vec::new();
    for (ty, block) in [
        (BsrType::Fp8, 128),
        (BsrType::Bf16, 128),
        (BsrType::Bf16, 64),
        (BsrType::F16, 128),
    ] {
        for size in [4096usize, 8192] {
            for pattern in [Pattern::Random, Pattern::Banded, Pattern::BlockDiagonal] {
                if size > 4096 && pattern == Pattern::BlockDiagonal {
                    continue;
                }
                for density in [0.05, 0.10, 0.25, 0.50, 1.0] {
                    cases.push(BsrCase {
                        ty,
                        block,
                        m: size,
                        n: size,
                        k: size,
                        density,
                        pattern,
                        side: SparseSide::B,
                        warmup,
                        iters,
                        seed: 1 + cases.len() as u64,
                        plan: None,
                    });
                }
            }
        }
        for density in [0.10, 0.50] {
            cases.push(BsrCase {
                ty,
                block,
                m: 4096,
                n: 4096,
                k: 4096,
                density,
                pattern: Pattern::Random,
                side: SparseSide::A,
                warmup,
                iters,
                seed: 100 + cases.len() as u64,
                plan: None,
            });
        }
    }
    cases
}
