//! GPU self-test of the cuBLASLt peers: every output element is compared with
//! a float64 CPU product of the same decoded inputs.
//!
//! Run on a machine with a GPU and libcublasLt in LD_LIBRARY_PATH:
//! `cargo test -p blockscaled-benches --test peer_gpu -- --ignored --nocapture`

use std::sync::Arc;

use blockscaled_benches::cublaslt::{
    LtPeer, PeerError, blk128_index, blk128_ld, blk128_len, blocks128, vec128_index, vec128_len,
};
use cudarc::driver::{CudaContext, CudaStream};

/// Shapes (m, n, k, must_run). The first is aligned and must be supported on
/// an H100; the second is ragged (partial 128-blocks in M and N, K/128 = 3
/// so the BLK128x128 pitch is padded) and may legitimately have no algorithm.
/// K = 640 in the first gives 5 K-blocks, padded pitch 8.
const SHAPES: [(usize, usize, usize, bool); 2] = [(256, 384, 640, true), (200, 320, 384, false)];

/// Small deterministic generator (xorshift64*), no extra dependency.
struct Rng(u64);
impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn bf16_to_f64(bits: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(bits) << 16))
}

fn bf16_is_nan(bits: u16) -> bool {
    (bits & 0x7f80) == 0x7f80 && (bits & 0x007f) != 0
}

/// Exact e4m3 (OCP FP8, "fn" variant) decoder from the bit fields:
/// sign 1 bit, exponent 4 bits (bias 7), mantissa 3 bits; exponent 0 is
/// subnormal (m/8 · 2^-6); S.1111.111 is NaN; no infinities.
fn e4m3_to_f64(byte: u8) -> f64 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((byte >> 3) & 0x0f);
    let man = f64::from(byte & 0x07);
    if exp == 0x0f && man == 7.0 {
        return f64::NAN;
    }
    if exp == 0 {
        sign * (man / 8.0) * 2f64.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f64.powi(exp - 7)
    }
}

/// Random non-zero bf16 with magnitude in [0.25, 2).
fn rand_bf16(rng: &mut Rng) -> u16 {
    let mag = 0.25 + 1.75 * rng.unit();
    let v = if rng.next_u64() & 1 == 1 { -mag } else { mag };
    let b = half::bf16::from_f64(v).to_bits();
    assert!(b & 0x7fff != 0);
    b
}

/// Random non-zero, non-NaN e4m3 normal with exponent field 4..=10
/// (magnitudes 2^-3 .. 1.875·2^3).
fn rand_e4m3(rng: &mut Rng) -> u8 {
    let r = rng.next_u64();
    let sign = ((r & 1) as u8) << 7;
    let exp = 4 + ((r >> 1) % 7) as u8;
    let man = ((r >> 8) & 7) as u8;
    sign | (exp << 3) | man
}

/// Random scale 2^e · (1 + u/2) with e in -2..=2: varied enough that a wrong
/// scale layout shows up as errors far above the tolerance.
fn rand_scale(rng: &mut Rng) -> f32 {
    let e = (rng.next_u64() % 5) as i32 - 2;
    (2f64.powi(e) * (1.0 + 0.5 * rng.unit())) as f32
}

fn setup() -> (Arc<CudaStream>, LtPeer) {
    let ctx = CudaContext::new(0).expect("CUDA device 0");
    let stream = ctx.new_stream().expect("stream");
    let peer = LtPeer::new(stream.clone()).expect("cuBLASLt");
    eprintln!("cublasLtGetVersion() = {}", peer.version());
    (stream, peer)
}

/// Handles a peer call's result: Ok -> true (go on and compare); an
/// "unavailable" error on an optional shape -> false (skip); otherwise panic.
fn ran(what: &str, shape: (usize, usize, usize, bool), r: Result<(), PeerError>) -> bool {
    match r {
        Ok(()) => true,
        Err(e) if !shape.3 && e.is_unavailable() => {
            eprintln!("{what} {shape:?}: skipped, {e}");
            false
        }
        Err(e) => panic!("{what} {shape:?}: {e}"),
    }
}

/// f64 reference C[mi][ni] = Σ_k a(mi,k)·b(ni,k), plus Σ|a·b| per element.
fn reference(
    m: usize,
    n: usize,
    k: usize,
    a: impl Fn(usize, usize) -> f64,
    b: impl Fn(usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let ad: Vec<f64> = (0..m * k).map(|i| a(i / k, i % k)).collect();
    let bd: Vec<f64> = (0..n * k).map(|i| b(i / k, i % k)).collect();
    let mut c = vec![0.0; m * n];
    let mut abs = vec![0.0; m * n];
    for mi in 0..m {
        let ar = &ad[mi * k..(mi + 1) * k];
        for ni in 0..n {
            let br = &bd[ni * k..(ni + 1) * k];
            let (mut s, mut sa) = (0.0, 0.0);
            for (x, y) in ar.iter().zip(br) {
                s += x * y;
                sa += (x * y).abs();
            }
            c[mi * n + ni] = s;
            abs[mi * n + ni] = sa;
        }
    }
    (c, abs)
}

/// Compares every element; returns the worst (|err| / tol) and its index.
fn compare(got: &[u16], want: &[f64], tol: impl Fn(usize) -> f64) -> (f64, usize) {
    assert_eq!(got.len(), want.len());
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(!bf16_is_nan(g), "NaN (poison left or produced) at {i}");
        let g = bf16_to_f64(g);
        assert!(g.is_finite(), "inf at {i}");
        let r = (g - w).abs() / tol(i);
        if r > worst.0 {
            worst = (r, i);
        }
    }
    worst
}

fn max_abs(xs: &[f64]) -> f64 {
    xs.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

#[test]
#[ignore = "needs a CUDA device"]
fn bf16_matches_cpu() {
    let (stream, peer) = setup();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for shape in SHAPES {
        let (m, n, k, _) = shape;
        let a: Vec<u16> = (0..m * k).map(|_| rand_bf16(&mut rng)).collect();
        let b: Vec<u16> = (0..n * k).map(|_| rand_bf16(&mut rng)).collect();
        let da = stream.clone_htod(&a).unwrap();
        let db = stream.clone_htod(&b).unwrap();
        // Poison C with NaN bit patterns.
        let mut dc = stream.clone_htod(&vec![0xffffu16; m * n]).unwrap();
        if !ran("bf16", shape, peer.gemm_bf16(m, n, k, &da, &db, &mut dc)) {
            continue;
        }
        // Second call reuses the cached plan.
        peer.gemm_bf16(m, n, k, &da, &db, &mut dc).unwrap();
        let got = stream.clone_dtoh(&dc).unwrap();
        let (want, abs) = reference(
            m,
            n,
            k,
            |i, j| bf16_to_f64(a[i * k + j]),
            |i, j| bf16_to_f64(b[i * k + j]),
        );
        // Tolerance: bf16 output rounding (2^-9 relative, 2^-8 allowed) plus
        // a worst-case fp32 accumulation bound k·2^-24·Σ|a·b|.
        let tol =
            |i: usize| 2f64.powi(-8) * want[i].abs() + k as f64 * 2f64.powi(-24) * abs[i] + 1e-30;
        let (r, i) = compare(&got, &want, tol);
        eprintln!("bf16 {shape:?}: worst err/tol = {r:.3} at {i}");
        assert!(
            r <= 1.0,
            "bf16 {shape:?}: C[{}][{}] = {} vs ref {} (tol {})",
            i / n,
            i % n,
            bf16_to_f64(got[i]),
            want[i],
            tol(i)
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fp8_per_tensor_matches_cpu() {
    let (stream, peer) = setup();
    let mut rng = Rng(0x0bad_cafe_f00d_1234);
    for shape in SHAPES {
        let (m, n, k, _) = shape;
        let a: Vec<u8> = (0..m * k).map(|_| rand_e4m3(&mut rng)).collect();
        let b: Vec<u8> = (0..n * k).map(|_| rand_e4m3(&mut rng)).collect();
        let (sa, sb) = (0.375f32, 1.25f32);
        let da = stream.clone_htod(&a).unwrap();
        let db = stream.clone_htod(&b).unwrap();
        let dsa = stream.clone_htod(&[sa]).unwrap();
        let dsb = stream.clone_htod(&[sb]).unwrap();
        let mut dc = stream.clone_htod(&vec![0xffffu16; m * n]).unwrap();
        let r = peer.gemm_fp8_per_tensor(m, n, k, &da, &dsa, &db, &dsb, &mut dc);
        if !ran("fp8 per-tensor", shape, r) {
            continue;
        }
        let got = stream.clone_dtoh(&dc).unwrap();
        let (want, _) = reference(
            m,
            n,
            k,
            |i, j| e4m3_to_f64(a[i * k + j]) * f64::from(sa),
            |i, j| e4m3_to_f64(b[i * k + j]) * f64::from(sb),
        );
        // Tolerance: bf16 output rounding (2^-8 relative) plus, as a first
        // bound for the FP8 tensor-core accumulation error, 1e-2 of max|ref|.
        // (Inputs are exact in fp8, products exact in fp32; the only other
        // error is the accumulator's. Tighten once measured on H100.)
        let mx = max_abs(&want);
        let tol = |i: usize| 2f64.powi(-8) * want[i].abs() + 1e-2 * mx;
        let (r, i) = compare(&got, &want, tol);
        eprintln!("fp8 per-tensor {shape:?}: worst err/tol = {r:.3} at {i}");
        assert!(
            r <= 1.0,
            "fp8 per-tensor {shape:?}: C[{}][{}] = {} vs ref {} (tol {})",
            i / n,
            i % n,
            bf16_to_f64(got[i]),
            want[i],
            tol(i)
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn fp8_blockwise_matches_cpu() {
    let (stream, peer) = setup();
    let mut rng = Rng(0x5eed_0000_1111_2222);
    for shape in SHAPES {
        let (m, n, k, _) = shape;
        let (kb, nb) = (blocks128(k), blocks128(n));
        let a: Vec<u8> = (0..m * k).map(|_| rand_e4m3(&mut rng)).collect();
        let b: Vec<u8> = (0..n * k).map(|_| rand_e4m3(&mut rng)).collect();
        // A: 1x128 scales, M-major (vec128_index).
        let mut sa = vec![0f32; vec128_len(m, k)];
        for kbi in 0..kb {
            for mi in 0..m {
                sa[vec128_index(mi, kbi, m)] = rand_scale(&mut rng);
            }
        }
        // B: 128x128 scales, K-block contiguous, pitch padded to 4. Padding
        // gets a huge finite value: if cuBLASLt read it as a real scale (our
        // pitch wrong), the result would be far off; finite so that a
        // harmless read of padding times zero stays zero.
        let mut sb = vec![1.0e6f32; blk128_len(n, k)];
        for nbi in 0..nb {
            for kbi in 0..kb {
                sb[blk128_index(nbi, kbi, k)] = rand_scale(&mut rng);
            }
        }
        let da = stream.clone_htod(&a).unwrap();
        let db = stream.clone_htod(&b).unwrap();
        let dsa = stream.clone_htod(&sa).unwrap();
        let dsb = stream.clone_htod(&sb).unwrap();
        let mut dc = stream.clone_htod(&vec![0xffffu16; m * n]).unwrap();
        let r = peer.gemm_fp8_blockwise(m, n, k, &da, &dsa, &db, &dsb, &mut dc);
        if !ran("fp8 blockwise", shape, r) {
            continue;
        }
        let got = stream.clone_dtoh(&dc).unwrap();

        // Reference with a given interpretation of the two scale buffers.
        let reference_with = |sa_at: &dyn Fn(usize, usize) -> f32,
                              sb_at: &dyn Fn(usize, usize) -> f32| {
            reference(
                m,
                n,
                k,
                |i, j| e4m3_to_f64(a[i * k + j]) * f64::from(sa_at(i, j / 128)),
                |i, j| e4m3_to_f64(b[i * k + j]) * f64::from(sb_at(i / 128, j / 128)),
            )
            .0
        };
        let want = reference_with(&|mi, kbi| sa[vec128_index(mi, kbi, m)], &|nbi, kbi| {
            sb[blk128_index(nbi, kbi, k)]
        });
        // Tolerance: bf16 output rounding (2^-8 relative) plus 1e-2·max|ref|
        // as a first bound for FP8 accumulation error (see the per-tensor
        // test).
        let mx = max_abs(&want);
        let tol = |i: usize| 2f64.powi(-8) * want[i].abs() + 1e-2 * mx;
        let (r, i) = compare(&got, &want, tol);
        eprintln!("fp8 blockwise {shape:?}: worst err/tol = {r:.3} at {i}");
        if r > 1.0 {
            // Diagnose: which scale layout would the output match instead?
            let ld = blk128_ld(k);
            let get = |v: &Vec<f32>, idx: usize| v.get(idx).copied().unwrap_or(f32::NAN);
            let alternatives: [(&str, Vec<f64>); 4] = [
                (
                    "A K-major (mi*kb+kbi), B as documented",
                    reference_with(&|mi, kbi| get(&sa, mi * kb + kbi), &|nbi, kbi| {
                        get(&sb, nbi * ld + kbi)
                    }),
                ),
                (
                    "A as documented, B unpadded pitch (nbi*kb+kbi)",
                    reference_with(&|mi, kbi| get(&sa, kbi * m + mi), &|nbi, kbi| {
                        get(&sb, nbi * kb + kbi)
                    }),
                ),
                (
                    "A as documented, B N-major (kbi*nb+nbi)",
                    reference_with(&|mi, kbi| get(&sa, kbi * m + mi), &|nbi, kbi| {
                        get(&sb, kbi * nb + nbi)
                    }),
                ),
                (
                    "A K-major, B N-major",
                    reference_with(&|mi, kbi| get(&sa, mi * kb + kbi), &|nbi, kbi| {
                        get(&sb, kbi * nb + nbi)
                    }),
                ),
            ];
            for (name, alt) in &alternatives {
                let mxa = max_abs(alt);
                let worst = got
                    .iter()
                    .zip(alt)
                    .map(|(&g, &w)| {
                        (bf16_to_f64(g) - w).abs() / (2f64.powi(-8) * w.abs() + 1e-2 * mxa)
                    })
                    .fold(0.0f64, f64::max);
                eprintln!("  alternative layout '{name}': worst err/tol = {worst:.3}");
            }
            panic!(
                "fp8 blockwise {shape:?}: C[{}][{}] = {} vs ref {} (tol {})",
                i / n,
                i % n,
                bf16_to_f64(got[i]),
                want[i],
                tol(i)
            );
        }
    }
}

#[test]
fn e4m3_decoder_exact() {
    assert_eq!(e4m3_to_f64(0x00), 0.0);
    assert_eq!(e4m3_to_f64(0x38), 1.0); // exp 7, man 0
    assert_eq!(e4m3_to_f64(0xb8), -1.0);
    assert_eq!(e4m3_to_f64(0x7e), 448.0); // max normal
    assert_eq!(e4m3_to_f64(0x01), 2f64.powi(-9)); // min subnormal
    assert_eq!(e4m3_to_f64(0x08), 2f64.powi(-6)); // min normal
    assert_eq!(e4m3_to_f64(0x3c), 1.5);
    assert!(e4m3_to_f64(0x7f).is_nan() && e4m3_to_f64(0xff).is_nan());
    let mut rng = Rng(1);
    for _ in 0..1000 {
        let x = e4m3_to_f64(rand_e4m3(&mut rng));
        assert!(x != 0.0 && x.is_finite());
        assert!(x.abs() >= 0.125 && x.abs() < 16.0);
    }
    for _ in 0..1000 {
        let b = rand_bf16(&mut rng);
        let x = bf16_to_f64(b);
        assert!(x.abs() >= 0.25 && x.abs() <= 2.0, "{x}");
    }
    assert!(bf16_is_nan(0xffff) && !bf16_is_nan(0x7f80) && !bf16_is_nan(0x3f80));
}

/// Smoke test of the timing harness and the table on real work: bf16 and fp8
/// 4096³ through cuBLASLt, rotating among input sets.
#[test]
#[ignore = "needs a CUDA device"]
fn timing_smoke() {
    use blockscaled_benches::table::{Row, print_table};
    use blockscaled_benches::timing::{rotation_count, time_on_stream};
    let (stream, peer) = setup();
    let (m, n, k) = (4096usize, 4096usize, 4096usize);
    let sets = rotation_count(2 * (m * k + n * k), 50 << 20);
    let a: Vec<_> = (0..sets)
        .map(|_| stream.clone_htod(&vec![0x3f80u16; m * k]).unwrap())
        .collect();
    let b = stream.clone_htod(&vec![0x3f80u16; n * k]).unwrap();
    let mut c = stream.alloc_zeros::<u16>(m * n).unwrap();
    let t = time_on_stream(&stream, 5, 20, |i| {
        peer.gemm_bf16(m, n, k, &a[i % sets], &b, &mut c)
    })
    .unwrap();
    eprintln!("bf16 4096^3 with {sets} sets: {t:?}");
    assert_eq!(t.samples, 20);
    assert!(t.min_ms > 0.0 && t.min_ms <= t.median_ms && t.median_ms <= t.max_ms);
    let a8 = stream.clone_htod(&vec![0x38u8; m * k]).unwrap();
    let b8 = stream.clone_htod(&vec![0x38u8; n * k]).unwrap();
    let one = stream.clone_htod(&[1.0f32]).unwrap();
    let t8 = time_on_stream(&stream, 5, 20, |_| {
        peer.gemm_fp8_per_tensor(m, n, k, &a8, &one, &b8, &one, &mut c)
    })
    .unwrap();
    let flops = 2.0 * (m * n * k) as f64;
    let rows = [
        Row {
            name: "lt_bf16_vs_itself".into(),
            shape: (m, n, k, 1),
            ms: t.median_ms,
            flops,
            bytes: 2.0 * (m * k + n * k + m * n) as f64,
            peer_ms: Some(t.median_ms),
            peer_name: "cublasLt".into(),
            ceiling_tflops: 989.0,
            ceiling_gbs: 3350.0,
        },
        Row {
            name: "lt_fp8_per_tensor".into(),
            shape: (m, n, k, 1),
            ms: t8.median_ms,
            flops,
            bytes: (m * k + n * k + 2 * m * n) as f64,
            peer_ms: None,
            peer_name: String::new(),
            ceiling_tflops: 1979.0,
            ceiling_gbs: 3350.0,
        },
    ];
    print_table(&rows);
    // An H100 cannot beat its dense peak.
    assert!(rows[0].tflops() < 1000.0 && rows[1].tflops() < 2000.0);
}
