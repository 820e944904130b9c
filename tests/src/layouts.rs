//! The same matrix with its scales in another layout: every helper here takes a quantized
//! [`ScaledMatrix`] and returns one (built with [`ScaledMatrix::from_parts`]) whose elements and
//! decoded scales are exactly those of the input, with the scale buffer laid out as asked.
//!
//! Element data is shared unchanged (its layout is fixed: K-major, batches outermost); only the
//! scale buffer moves. Every scale element the new layout does not address — gaps between
//! neighbours, padding after a row or a batch entry, a tail past the last scale — holds a poison
//! code ([`poison_scale_bits`]: NaN in every scale type), so a GEMM that reads a scale from the
//! wrong place produces NaN instead of a plausible number.
//!
//! Typical use in a GEMM test: compute the product with the default layouts, then with
//! [`layout_variants`] (or [`random_layout`] from a test's seed) of A and B, and require the same
//! result.

use blockscaled::{MatrixDesc, ScaleLayout, ScaleMajor, ScaleType, ScaledMatrix};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One index of the scale grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleAxis {
    /// The batch entry `l`.
    Batch,
    /// The row block `rb` (M or N direction).
    Row,
    /// The K block `kb`.
    K,
}

/// An affine scale layout described by the nesting order of the three indices and the padding
/// around them (see [`ScaleSpec::layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScaleSpec {
    /// Outermost to innermost. `[Batch, Row, K]` is [`ScaleMajor::K`], `[Batch, K, Row]` is
    /// [`ScaleMajor::Mn`]; orders with the batch inside are valid layouts too.
    pub order: [ScaleAxis; 3],
    /// Stride of the innermost index (1: packed; more leaves gaps between neighbours).
    pub inner_stride: usize,
    /// Extra scale elements after each run of the innermost index.
    pub middle_gap: usize,
    /// Extra scale elements after each run of the middle index.
    pub outer_gap: usize,
    /// Extra scale elements after the last scale.
    pub tail: usize,
}

impl ScaleSpec {
    /// The packed layout of the given major order (what [`ScaleLayout::packed`] builds).
    pub fn packed(major: ScaleMajor) -> Self {
        let order = match major {
            ScaleMajor::K => [ScaleAxis::Batch, ScaleAxis::Row, ScaleAxis::K],
            ScaleMajor::Mn => [ScaleAxis::Batch, ScaleAxis::K, ScaleAxis::Row],
        };
        ScaleSpec {
            order,
            inner_stride: 1,
            middle_gap: 0,
            outer_gap: 0,
            tail: 0,
        }
    }

    /// `packed(major)` with every kind of gap: innermost stride `inner_stride`, `middle_gap`
    /// after each row (K-major) or K block (MN-major), `outer_gap` after each batch entry, and one
    /// element of tail.
    pub fn padded(
        major: ScaleMajor,
        inner_stride: usize,
        middle_gap: usize,
        outer_gap: usize,
    ) -> Self {
        ScaleSpec {
            inner_stride,
            middle_gap,
            outer_gap,
            tail: 1,
            ..Self::packed(major)
        }
    }

    /// The layout for a grid of `row_blocks` × `k_blocks` scales per batch entry and `batch`
    /// entries. Strides grow from the inside out, each at least the extent of what it contains
    /// plus its gap, so distinct (l, rb, kb) never share an element.
    pub fn layout(&self, row_blocks: usize, k_blocks: usize, batch: usize) -> ScaleLayout {
        assert!(self.inner_stride >= 1, "a zero stride would alias scales");
        let mut order = self.order;
        order.sort_by_key(|a| *a as u8);
        assert_eq!(
            order,
            [ScaleAxis::Batch, ScaleAxis::Row, ScaleAxis::K],
            "each axis exactly once"
        );
        let extent = |a: ScaleAxis| match a {
            ScaleAxis::Batch => batch,
            ScaleAxis::Row => row_blocks,
            ScaleAxis::K => k_blocks,
        };
        let [outer, middle, inner] = self.order;
        let inner_s = self.inner_stride;
        let middle_s = (extent(inner) - 1) * inner_s + 1 + self.middle_gap;
        let outer_s =
            (extent(middle) - 1) * middle_s + (extent(inner) - 1) * inner_s + 1 + self.outer_gap;
        let stride = |a: ScaleAxis| {
            if a == inner {
                inner_s
            } else if a == middle {
                middle_s
            } else {
                debug_assert_eq!(a, outer);
                outer_s
            }
        };
        ScaleLayout {
            row_blocks,
            k_blocks,
            row_stride: stride(ScaleAxis::Row),
            k_stride: stride(ScaleAxis::K),
            batch_stride: stride(ScaleAxis::Batch),
        }
    }
}

/// A scale code that decodes to NaN (little-endian in the low bytes for fp32): what fills every
/// scale element a layout does not address. ue4m3 uses 0x7F (its NaN without the sign bit, which
/// `from_parts` rejects anywhere in the buffer).
pub fn poison_scale_bits(t: ScaleType) -> u32 {
    match t {
        ScaleType::E8M0 => 0xFF,
        ScaleType::UE4M3 => 0x7F,
        ScaleType::F32 => f32::NAN.to_bits() | 0x5A5,
    }
}

/// `m` with its scales moved to `layout` (which must cover the same grid and map distinct scales
/// to distinct elements: panics otherwise) in a buffer of `layout.required_len + tail` scale
/// elements; everything not addressed holds [`poison_scale_bits`].
pub fn with_scale_layout(m: &ScaledMatrix, layout: ScaleLayout, tail: usize) -> ScaledMatrix {
    let d = *m.desc();
    let old = d.scale_layout;
    assert_eq!(
        (old.row_blocks, old.k_blocks),
        (layout.row_blocks, layout.k_blocks),
        "the new layout must cover the same scale grid"
    );
    let sb = d.format.scale.bytes();
    let len = layout
        .required_len(d.batch)
        .expect("a layout that fits in memory")
        + tail;
    let poison = poison_scale_bits(d.format.scale).to_le_bytes();
    let mut scales: Vec<u8> = (0..len).flat_map(|_| poison[..sb].to_vec()).collect();
    let mut written = vec![false; len];
    for l in 0..d.batch {
        for rb in 0..layout.row_blocks {
            for kb in 0..layout.k_blocks {
                let (from, to) = (old.index(l, rb, kb), layout.index(l, rb, kb));
                assert!(
                    !written[to],
                    "layout {layout:?} maps two scales to element {to}"
                );
                written[to] = true;
                scales[to * sb..(to + 1) * sb]
                    .copy_from_slice(&m.scales()[from * sb..(from + 1) * sb]);
            }
        }
    }
    let desc = MatrixDesc {
        scale_layout: layout,
        ..d
    };
    ScaledMatrix::from_desc(desc, m.data().to_vec(), scales)
        .expect("the same matrix with a complete scale layout")
}

/// `m` with its scales in the layout `spec` describes (see [`ScaleSpec::layout`]), poisoned gaps.
pub fn relayout(m: &ScaledMatrix, spec: ScaleSpec) -> ScaledMatrix {
    let s = m.scale_layout();
    with_scale_layout(
        m,
        spec.layout(s.row_blocks, s.k_blocks, m.batch()),
        spec.tail,
    )
}

/// `m` with packed MN-major scales (the row blocks of one K block adjacent).
pub fn mn_major(m: &ScaledMatrix) -> ScaledMatrix {
    relayout(m, ScaleSpec::packed(ScaleMajor::Mn))
}

/// `m` with packed K-major scales (the K blocks of one row block adjacent).
pub fn k_major(m: &ScaledMatrix) -> ScaledMatrix {
    relayout(m, ScaleSpec::packed(ScaleMajor::K))
}

/// A random layout from `seed`: any nesting order, innermost stride 1–3, gaps 0–5, tail 0–3.
pub fn random_spec(seed: u64) -> ScaleSpec {
    use ScaleAxis::*;
    const ORDERS: [[ScaleAxis; 3]; 6] = [
        [Batch, Row, K],
        [Batch, K, Row],
        [Row, Batch, K],
        [Row, K, Batch],
        [K, Batch, Row],
        [K, Row, Batch],
    ];
    let mut rng = StdRng::seed_from_u64(seed);
    ScaleSpec {
        order: ORDERS[rng.random_range(0..ORDERS.len())],
        inner_stride: rng.random_range(1..=3),
        middle_gap: rng.random_range(0..=5),
        outer_gap: rng.random_range(0..=5),
        tail: rng.random_range(0..=3),
    }
}

/// `m` with its scales in [`random_spec`]`(seed)`'s layout.
pub fn random_layout(m: &ScaledMatrix, seed: u64) -> ScaledMatrix {
    relayout(m, random_spec(seed))
}

/// Named variants of `m` that hold the same values: packed K-major, packed MN-major, both padded
/// (innermost stride 2, a gap after every row / K block and batch entry, a tail), and the batch
/// index innermost. Which one is `m`'s own layout does not matter: each is rebuilt.
pub fn layout_variants(m: &ScaledMatrix) -> Vec<(&'static str, ScaledMatrix)> {
    use ScaleAxis::*;
    let batch_inner = ScaleSpec {
        order: [Row, K, Batch],
        inner_stride: 1,
        middle_gap: 1,
        outer_gap: 2,
        tail: 0,
    };
    [
        ("k-major", ScaleSpec::packed(ScaleMajor::K)),
        ("mn-major", ScaleSpec::packed(ScaleMajor::Mn)),
        ("k-major padded", ScaleSpec::padded(ScaleMajor::K, 2, 3, 5)),
        (
            "mn-major padded",
            ScaleSpec::padded(ScaleMajor::Mn, 2, 3, 5),
        ),
        ("batch innermost", batch_inner),
    ]
    .into_iter()
    .map(|(name, spec)| (name, relayout(m, spec)))
    .collect()
}
