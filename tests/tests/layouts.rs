//! Scale layouts: the CPU reference GEMM gives bit-identical results whatever affine layout the
//! scales are stored in (packed K-major, MN-major, strided, padded, batch innermost), never reads a
//! scale element the layout does not address, and `ScaledMatrix::from_parts` answers every layout
//! — however large, empty, overflowing or inconsistent — with a matrix it can read in full or a
//! typed error, never a panic.

use blockscaled::{
    ElemType, Error, OperandFormat, OutType, Recipe, ScaleBlock, ScaleLayout, ScaleMajor,
    ScaleType, ScaledMatrix, reference,
};
use blockscaled_tests::layouts::{
    ScaleSpec, k_major, layout_variants, mn_major, poison_scale_bits, random_layout, random_spec,
    relayout,
};
use blockscaled_tests::random_matrix;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The f64 values' bit patterns: equality of these is bitwise equality, NaN included.
fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `K` for a recipe: e2m1 packs two elements per byte, so its K is rounded up to even.
fn k_for(recipe: Recipe, k: usize) -> usize {
    if recipe.a().elem == ElemType::E2M1 || recipe.b().elem == ElemType::E2M1 {
        k + k % 2
    } else {
        k
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Same values in any scale layout: `dequantize` and the reference GEMM (float64 sums and the
    /// rounded output) are bit-identical to those of the default layout, for every recipe, with A
    /// and B in independently chosen layouts (one of the named variants, and a random one).
    #[test]
    fn reference_gemm_is_bitwise_invariant_under_scale_layout(
        recipe_i in 0..Recipe::ALL.len(),
        m in 1usize..48,
        n in 1usize..48,
        k in 1usize..200,
        l in 1usize..=8,
        seed in any::<u64>(),
        variant_a in 0usize..5,
        variant_b in 0usize..5,
        spec_seed in any::<u64>(),
        out_i in 0usize..3,
    ) {
        let recipe = Recipe::ALL[recipe_i];
        let k = k_for(recipe, k);
        let dtype = [OutType::Bf16, OutType::F16, OutType::F32][out_i];
        let (_, a) = random_matrix(seed, m, k, l, recipe.a());
        let (_, b) = random_matrix(seed ^ 0x9E37_79B9_7F4A_7C15, n, k, l, recipe.b());
        let (c, abs) = reference::gemm_f64(&a, &b).unwrap();
        let (out, _) = reference::gemm(&a, &b, dtype).unwrap();
        prop_assert!(c.iter().all(|v| v.is_finite()), "{recipe}: the default layout gives non-finite values");
        prop_assert!(abs.iter().any(|&v| v > 0.0), "{recipe}: all-zero inputs");

        let (da, db) = (bits(&a.dequantize()), bits(&b.dequantize()));
        let va = layout_variants(&a).swap_remove(variant_a);
        let vb = layout_variants(&b).swap_remove(variant_b);
        let ra = ("random", random_layout(&a, spec_seed));
        let rb = ("random", random_layout(&b, spec_seed.rotate_left(17)));
        for ((na, a2), (nb, b2)) in [(va, vb), (ra, rb)] {
            let what = format!(
                "{recipe} {m}x{n}x{k}x{l}, A {na} {:?}, B {nb} {:?}",
                a2.scale_layout(),
                b2.scale_layout()
            );
            prop_assert!(bits(&a2.dequantize()) == da, "{what}: A dequantizes differently");
            prop_assert!(bits(&b2.dequantize()) == db, "{what}: B dequantizes differently");
            let (c2, abs2) = reference::gemm_f64(&a2, &b2).unwrap();
            prop_assert!(bits(&c2) == bits(&c), "{what}: float64 product differs");
            prop_assert!(bits(&abs2) == bits(&abs), "{what}: Σ|a·b| differs");
            let (out2, _) = reference::gemm(&a2, &b2, dtype).unwrap();
            let (g, w): (Vec<u32>, Vec<u32>) = (
                out2.values.iter().map(|v| v.to_bits()).collect(),
                out.values.iter().map(|v| v.to_bits()).collect(),
            );
            prop_assert!(g == w, "{what}: {dtype:?} output differs");
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A relaid matrix's scale buffer holds each scale once and poison (a NaN code) everywhere
    /// else: the gaps a layout leaves are really there and really poisoned.
    #[test]
    fn relaid_scale_buffers_hold_each_scale_once_and_poison_elsewhere(
        recipe_i in 0..Recipe::ALL.len(),
        rows in 1usize..140,
        k in 1usize..300,
        l in 1usize..=8,
        seed in any::<u64>(),
        spec_seed in any::<u64>(),
        is_b in any::<bool>(),
    ) {
        let recipe = Recipe::ALL[recipe_i];
        let k = k_for(recipe, k);
        let format = if is_b { recipe.b() } else { recipe.a() };
        let (_, q) = random_matrix(seed, rows, k, l, format);
        let spec = random_spec(spec_seed);
        let r = relayout(&q, spec);
        let s = *r.scale_layout();
        let sb = format.scale.bytes();
        let len = r.scales().len() / sb;
        prop_assert_eq!(len, s.required_len(l).unwrap() + spec.tail);
        let nan = (0..len)
            .filter(|&i| {
                let mut w = [0u8; 4];
                w[..sb].copy_from_slice(&r.scales()[i * sb..(i + 1) * sb]);
                format.scale.decode_bits(u32::from_le_bytes(w)).is_nan()
            })
            .count();
        // Quantized scales are never NaN, so the NaN elements are exactly the unaddressed ones.
        prop_assert_eq!(nan, len - l * s.row_blocks * s.k_blocks, "{:?} {:?}", spec, s);
    }
}

/// The packed helpers build exactly what the quantizer builds for that major order: same data,
/// same scale bytes, same layout, for every recipe's A and B.
#[test]
fn packed_relayouts_equal_quantizing_with_that_major_order() {
    for recipe in Recipe::ALL {
        for format in [recipe.a(), recipe.b()] {
            let (rows, k, l) = (131, 290, 3);
            let v = blockscaled_tests::random_values(7, rows * k * l, k);
            let q =
                |major| ScaledMatrix::quantize_with_major(&v, rows, k, l, format, major).unwrap();
            let (qk, qmn) = (q(ScaleMajor::K), q(ScaleMajor::Mn));
            assert!(mn_major(&qk) == qmn, "{format}: K-major to MN-major");
            assert!(k_major(&qmn) == qk, "{format}: MN-major to K-major");
        }
    }
}

#[test]
fn poison_scale_codes_decode_to_nan() {
    for t in [ScaleType::E8M0, ScaleType::UE4M3, ScaleType::F32] {
        assert!(t.decode_bits(poison_scale_bits(t)).is_nan(), "{t:?}");
    }
}

/// The poison is what a misread would see: the same padded buffer described with a K stride of 1
/// (reading the gaps between neighbours) dequantizes to NaN somewhere, for every recipe whose
/// matrices have two or more K blocks.
#[test]
fn reading_a_gap_of_a_padded_layout_gives_nan() {
    for recipe in Recipe::ALL {
        for (i, format) in [recipe.a(), recipe.b()].into_iter().enumerate() {
            let (_, q) = random_matrix(40 + i as u64, 3, 256, 2, format);
            let p = relayout(&q, ScaleSpec::padded(ScaleMajor::K, 2, 1, 1));
            let s = *p.scale_layout();
            if s.k_blocks < 2 {
                continue;
            }
            let misread = ScaledMatrix::from_parts(
                format,
                3,
                256,
                2,
                p.data().to_vec(),
                p.scales().to_vec(),
                ScaleLayout { k_stride: 1, ..s },
                p.tensor_scale(),
            )
            .unwrap();
            assert!(p.dequantize().iter().all(|v| v.is_finite()), "{format}");
            assert!(misread.dequantize().iter().any(|v| v.is_nan()), "{format}");
        }
    }
}

/// A `from_parts` call with arbitrary parameters.
#[derive(Clone, Debug)]
struct Parts {
    format: OperandFormat,
    rows: usize,
    k: usize,
    batch: usize,
    layout: ScaleLayout,
    data_len: usize,
    scales_len: usize,
    tensor_scale: f32,
    seed: u64,
    clear_sign_bits: bool,
}

/// Sizes: mostly small, sometimes zero, sometimes at or past a limit or near `usize::MAX`.
fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..8,
        3 => 0usize..200,
        2 => prop::sample::select(vec![
            usize::MAX,
            usize::MAX - 1,
            usize::MAX / 2,
            usize::MAX / 3,
            usize::MAX / 4 + 1,
            1 << 62,
            1 << 33,
            (1 << 32) + 1,
            1 << 32,
            u32::MAX as usize,
            i32::MAX as usize + 1,
            i32::MAX as usize,
            65536,
            65535,
        ]),
    ]
}

fn block_dim() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => prop::sample::select(vec![1u32, 16, 32, 128]),
        2 => 0u32..200,
        1 => prop::sample::select(vec![u32::MAX, u32::MAX - 1, 1 << 31, i32::MAX as u32]),
    ]
}

/// Every recipe's formats, and arbitrary combinations (unsupported ones included).
fn any_format() -> impl Strategy<Value = OperandFormat> {
    let recipe = (0..Recipe::ALL.len(), any::<bool>()).prop_map(|(i, b)| {
        if b {
            Recipe::ALL[i].b()
        } else {
            Recipe::ALL[i].a()
        }
    });
    let block = prop_oneof![
        Just(ScaleBlock::PerTensor),
        Just(ScaleBlock::PerRow),
        (block_dim(), block_dim()).prop_map(|(rows, k)| ScaleBlock::Tile { rows, k }),
    ];
    let arbitrary = (
        prop::sample::select(vec![ElemType::E4M3, ElemType::E5M2, ElemType::E2M1]),
        prop::sample::select(vec![ScaleType::E8M0, ScaleType::UE4M3, ScaleType::F32]),
        block,
        any::<bool>(),
    )
        .prop_map(|(elem, scale, block, tensor_scale)| OperandFormat {
            elem,
            scale,
            block,
            tensor_scale,
        });
    prop_oneof![3 => recipe, 2 => arbitrary]
}

fn any_tensor_scale() -> impl Strategy<Value = f32> {
    prop_oneof![
        4 => Just(1.0f32),
        2 => 1e-30f32..1e30,
        2 => prop::sample::select(vec![
            0.0f32, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE,
            1e-45, f32::MAX, 0.5,
        ]),
        1 => any::<f32>(),
    ]
}

/// Field groups of [`Parts`] that [`any_parts`] may make arbitrary.
const WILD_FORMAT: u8 = 1;
const WILD_ROWS: u8 = 2;
const WILD_K: u8 = 4;
const WILD_BATCH: u8 = 8;
const WILD_BLOCKS: u8 = 16;
const WILD_STRIDES: u8 = 32;
const WILD_LENGTHS: u8 = 64;
const WILD_TENSOR_SCALE: u8 = 128;

/// A third of the calls consistent (a recipe's format, small sizes, block counts, data length and
/// scale length derived from the rest, small strides that may alias), a third with one field
/// group arbitrary, a third with any groups arbitrary.
fn any_parts() -> impl Strategy<Value = Parts> {
    let wild = prop_oneof![Just(0u8), (0u32..8).prop_map(|i| 1u8 << i), any::<u8>(),];
    let recipe = (0..Recipe::ALL.len(), any::<bool>()).prop_map(|(i, b)| {
        if b {
            Recipe::ALL[i].b()
        } else {
            Recipe::ALL[i].a()
        }
    });
    let formats = (recipe, any_format());
    let dims = (
        (1usize..24, 1usize..300, 1usize..5),
        (size(), size(), size()),
    );
    let blocks = (size(), size());
    let strides = (
        (0usize..6, 0usize..40, 0usize..400),
        (size(), size(), size()),
    );
    let lens = (0usize..3000, 0usize..3000, -2isize..3);
    let scales = (1e-3f32..1e3, any_tensor_scale());
    let rest = (any::<u64>(), prop::bool::weighted(0.8));
    (wild, formats, dims, blocks, strides, lens, scales, rest).prop_map(
        |(w, formats, dims, blocks, strides, lens, scales, (seed, clear_sign_bits))| {
            let pick = |bit: u8| w & bit != 0;
            let format = if pick(WILD_FORMAT) {
                formats.1
            } else {
                formats.0
            };
            let ((r0, k0, b0), (r1, k1, b1)) = dims;
            let rows = if pick(WILD_ROWS) { r1 } else { r0 };
            let k = if pick(WILD_K) { k1 } else { k0 };
            let batch = if pick(WILD_BATCH) { b1 } else { b0 };
            let (br, bk) = format.block.extent(rows, k);
            let (row_blocks, k_blocks) = if pick(WILD_BLOCKS) {
                blocks
            } else {
                (rows.div_ceil(br.max(1)), k.div_ceil(bk.max(1)))
            };
            let (row_stride, k_stride, batch_stride) = if pick(WILD_STRIDES) {
                strides.1
            } else {
                strides.0
            };
            let layout = ScaleLayout {
                row_blocks,
                k_blocks,
                row_stride,
                k_stride,
                batch_stride,
            };
            let want_data = (batch as u128)
                .saturating_mul(rows as u128)
                .saturating_mul(k as u128)
                .saturating_mul(format.elem.bits() as u128 / 4)
                / 2;
            let want_data = want_data.min(usize::MAX as u128) as usize;
            let want_scales = layout
                .required_len(batch)
                .and_then(|n| n.checked_mul(format.scale.bytes()))
                .unwrap_or(usize::MAX);
            // Real buffers stay small: a wanted length past 16 KiB gets an arbitrary small one.
            let (data_alt, scales_alt, slack) = lens;
            let small = |want: usize, alt: usize| if want <= 1 << 14 { want } else { alt };
            let (data_len, scales_len) = if pick(WILD_LENGTHS) {
                (data_alt, scales_alt)
            } else {
                (
                    small(want_data, data_alt),
                    small(want_scales, scales_alt).saturating_add_signed(slack),
                )
            };
            let tensor_scale = match (pick(WILD_TENSOR_SCALE), format.tensor_scale) {
                (true, _) => scales.1,
                (false, true) => scales.0,
                (false, false) => 1.0,
            };
            Parts {
                format,
                rows,
                k,
                batch,
                layout,
                data_len,
                scales_len,
                tensor_scale,
                seed,
                clear_sign_bits,
            }
        },
    )
}

fn build(p: &Parts) -> blockscaled::Result<ScaledMatrix> {
    let mut rng = StdRng::seed_from_u64(p.seed);
    let data: Vec<u8> = (0..p.data_len).map(|_| rng.random()).collect();
    let scales: Vec<u8> = (0..p.scales_len)
        .map(|_| {
            let b: u8 = rng.random();
            if p.clear_sign_bits { b & 0x7F } else { b }
        })
        .collect();
    ScaledMatrix::from_parts(
        p.format,
        p.rows,
        p.k,
        p.batch,
        data,
        scales,
        p.layout,
        p.tensor_scale,
    )
}

/// What an accepted matrix must satisfy, in 128-bit arithmetic that cannot overflow: the data is
/// exactly the elements, the last scale the layout reaches is inside the buffer, and every value
/// can be read.
fn check_accepted(p: &Parts, q: &ScaledMatrix) -> Result<(), String> {
    let (rows, k, batch) = (p.rows as u128, p.k as u128, p.batch as u128);
    if rows == 0 || k == 0 || batch == 0 {
        return Err("an empty matrix was accepted".into());
    }
    if q.data().len() as u128 * 8 != batch * rows * k * p.format.elem.bits() as u128 {
        return Err(format!(
            "{} data bytes for {batch}×{rows}×{k}",
            q.data().len()
        ));
    }
    let s = p.layout;
    let last = (batch - 1) * s.batch_stride as u128
        + (s.row_blocks as u128).saturating_sub(1) * s.row_stride as u128
        + (s.k_blocks as u128).saturating_sub(1) * s.k_stride as u128;
    if s.row_blocks == 0 || s.k_blocks == 0 {
        return Err("a layout without scales was accepted".into());
    }
    if (last + 1) * p.format.scale.bytes() as u128 > q.scales().len() as u128 {
        return Err(format!("scale {last} is past {} bytes", q.scales().len()));
    }
    let (br, bk) = q.desc().block_extent();
    if (rows.div_ceil(br as u128), k.div_ceil(bk as u128))
        != (s.row_blocks as u128, s.k_blocks as u128)
    {
        return Err(format!(
            "{}×{} blocks of {br}×{bk} for {rows}×{k}",
            s.row_blocks, s.k_blocks
        ));
    }
    if !(p.tensor_scale.is_finite() && p.tensor_scale > 0.0) {
        return Err(format!("tensor scale {} accepted", p.tensor_scale));
    }
    let v = q.dequantize();
    if v.len() as u128 != batch * rows * k {
        return Err(format!("{} values dequantized", v.len()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// `from_parts` with arbitrary formats, sizes (zero, huge, overflowing), block counts, strides,
    /// buffer lengths and tensor scales returns a typed error or a matrix whose every value can be
    /// read; it never panics.
    #[test]
    fn from_parts_never_panics_and_accepts_only_readable_matrices(p in any_parts()) {
        match build(&p) {
            Ok(q) => {
                if let Err(e) = check_accepted(&p, &q) {
                    return Err(TestCaseError::fail(format!("{p:?}: {e}")));
                }
            }
            Err(Error::Shape(msg) | Error::Alignment(msg) | Error::Format(msg)) => {
                prop_assert!(!msg.is_empty());
            }
            Err(e) => return Err(TestCaseError::fail(format!("{p:?}: unexpected error kind {e}"))),
        }
    }
}

/// The generator above reaches every outcome: accepted matrices (with strides other than packed)
/// and each kind of error, so the property is not vacuous.
#[test]
fn from_parts_cases_reach_every_outcome() {
    let mut runner = TestRunner::deterministic();
    let strategy = any_parts();
    let (mut ok, mut ok_strided, mut shape, mut alignment, mut format) = (0, 0, 0, 0, 0);
    for _ in 0..1000 {
        let p = strategy.new_tree(&mut runner).unwrap().current();
        match build(&p) {
            Ok(q) => {
                ok += 1;
                let s = q.scale_layout();
                let packed = [ScaleMajor::K, ScaleMajor::Mn]
                    .map(|m| ScaleLayout::packed(m, s.row_blocks, s.k_blocks));
                if !packed.contains(s) && q.batch() > 1 {
                    ok_strided += 1;
                }
            }
            Err(Error::Shape(_)) => shape += 1,
            Err(Error::Alignment(_)) => alignment += 1,
            Err(Error::Format(_)) => format += 1,
            Err(e) => panic!("{e}"),
        }
    }
    let counts = format!(
        "ok {ok} (strided, batched {ok_strided}), shape {shape}, alignment {alignment}, format {format}"
    );
    println!("{counts}");
    assert!(ok >= 150 && ok_strided >= 50, "{counts}");
    assert!(shape >= 200 && alignment >= 30 && format >= 40, "{counts}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Scales given in the 128×4 swizzled layout of cuBLAS / CUTLASS / torch `to_blocked` make the
    /// same matrix as the packed layout (bitwise data, scales and values), and writing them back
    /// out gives the swizzled buffer again, padding included (zeros, as `to_blocked` pads).
    #[test]
    fn swizzled_128x4_scales_round_trip_for_every_mx_and_nvfp4_recipe(
        recipe_i in 0usize..Recipe::ALL.len(),
        rows in 1usize..300,
        k_blocks in 1usize..12,
        batch in 1usize..4,
        seed in any::<u64>(),
    ) {
        let recipe = Recipe::ALL[recipe_i];
        let f = recipe.a();
        prop_assume!(matches!(f.scale, ScaleType::E8M0 | ScaleType::UE4M3));
        let block_k = f.block.extent(rows, 1 << 20).1;
        let k = block_k * k_blocks;
        let (_, m) = random_matrix(seed, rows, k, batch, f);
        let sw = m.scales_swizzled_128x4().unwrap();
        let back = ScaledMatrix::from_parts_swizzled_128x4(
            f,
            rows,
            k,
            batch,
            m.data().to_vec(),
            sw.clone(),
            m.tensor_scale(),
        )
        .unwrap();
        prop_assert_eq!(back.dequantize(), m.dequantize());
        prop_assert_eq!(back.scales_swizzled_128x4().unwrap(), sw);
    }
}

#[test]
fn swizzled_128x4_scales_of_the_wrong_length_or_format_are_errors() {
    let f = Recipe::Mxfp4.a();
    let (_, m) = random_matrix(5, 130, 64, 1, f);
    let sw = m.scales_swizzled_128x4().unwrap();
    // 130 rows × 2 K blocks: 2 row tiles × 1 column tile of 512.
    assert_eq!(sw.len(), 1024);
    let short = sw[..sw.len() - 1].to_vec();
    assert!(matches!(
        ScaledMatrix::from_parts_swizzled_128x4(f, 130, 64, 1, m.data().to_vec(), short, 1.0),
        Err(Error::Shape(_))
    ));
    let ds = Recipe::DeepSeekFp8.a();
    let (_, d) = random_matrix(6, 64, 256, 1, ds);
    assert!(matches!(d.scales_swizzled_128x4(), Err(Error::Format(_))));
    assert!(matches!(
        ScaledMatrix::from_parts_swizzled_128x4(
            ds,
            64,
            256,
            1,
            d.data().to_vec(),
            vec![0; 512],
            1.0
        ),
        Err(Error::Format(_))
    ));
}
