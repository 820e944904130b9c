//! The mixture-of-experts layer on one GPU (`MoeLayer`), each step checked against the host from
//! the GPU's own inputs to that step: the router's choices (exact) and weights (within the
//! device's `ex2.approx` arithmetic), each entry's row and the grouped rows (bit for bit), the
//! group values, both grouped GEMMs (FP8 accumulation bound), SwiGLU and its FP8 quantization
//! (half an e4m3 unit), and the combined output (bit for bit: the same f32 operations in the
//! same order). Fresh random tokens, logits and experts each case; the output poisoned with NaN
//! first; a second step with new tokens reuses the buffers.

use blockscaled::{
    Gpu, GroupLayout, MoeLayer, MoeOptions, MoeShape, OutType, Recipe, ScaledMatrix, Scoring,
};
use blockscaled_tests::moe::{
    StepOnHost, check_grouped_rows, check_swiglu_rows, combine, route, row_experts, slots,
};
use blockscaled_tests::{random_values, run_seed};

struct Case {
    tokens: usize,
    shape: MoeShape,
    layout: GroupLayout,
    scoring: Scoring,
    group_capacity: Option<usize>,
    output: OutType,
}

fn case(
    tokens: usize,
    (hidden, inter, experts, top_k): (usize, usize, usize, usize),
    layout: GroupLayout,
    scoring: Scoring,
    group_capacity: Option<usize>,
    output: OutType,
) -> Case {
    Case {
        tokens,
        shape: MoeShape {
            hidden,
            inter,
            experts,
            top_k,
        },
        layout,
        scoring,
        group_capacity,
        output,
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_moe_layer_routes_moves_and_combines_every_token_as_the_host_does() {
    let g = Gpu::new(0).unwrap();
    let fmt = Recipe::DeepSeekFp8.b();
    let seed = run_seed();
    let cases = [
        case(
            64,
            (256, 256, 8, 2),
            GroupLayout::Contiguous,
            Scoring::Softmax,
            None,
            OutType::Bf16,
        ),
        case(
            37,
            (384, 128, 16, 4),
            GroupLayout::Masked,
            Scoring::Sigmoid,
            None,
            OutType::F32,
        ),
        // A masked capacity below the busiest experts' counts: their later entries are dropped.
        case(
            200,
            (128, 384, 32, 8),
            GroupLayout::Masked,
            Scoring::Softmax,
            Some(20),
            OutType::Bf16,
        ),
        case(
            1,
            (256, 128, 4, 4),
            GroupLayout::Contiguous,
            Scoring::Sigmoid,
            None,
            OutType::Bf16,
        ),
        case(
            300,
            (256, 256, 64, 6),
            GroupLayout::Contiguous,
            Scoring::Softmax,
            None,
            OutType::F32,
        ),
    ];
    for (n, c) in cases.iter().enumerate() {
        let s = c.shape;
        let at = seed.wrapping_add(100 * n as u64);
        let w1 = ScaledMatrix::quantize(
            &random_values(at + 1, s.experts * 2 * s.inter * s.hidden, s.hidden),
            2 * s.inter,
            s.hidden,
            s.experts,
            fmt,
        )
        .unwrap();
        let w2 = ScaledMatrix::quantize(
            &random_values(at + 2, s.experts * s.hidden * s.inter, s.inter),
            s.hidden,
            s.inter,
            s.experts,
            fmt,
        )
        .unwrap();
        let (d1, d2) = (g.upload(&w1).unwrap(), g.upload(&w2).unwrap());
        let opts = MoeOptions {
            scoring: c.scoring,
            layout: c.layout,
            group_capacity: c.group_capacity,
            output: c.output,
            ..MoeOptions::default()
        };
        let mut layer = MoeLayer::new(&g, s, &d1, &d2, opts).unwrap();
        let masked =
            (c.layout == GroupLayout::Masked).then(|| c.group_capacity.unwrap_or(c.tokens));
        for step in 0..2u64 {
            let x = random_values(at + 10 + step, c.tokens * s.hidden, s.hidden);
            let logits = random_values(at + 20 + step, c.tokens * s.experts, s.experts);
            let xt = g.upload_tensor(&x, c.tokens, s.hidden, 1).unwrap();
            let lt = g.upload_tensor(&logits, c.tokens, s.experts, 1).unwrap();
            let mut out = g.output(c.tokens, s.hidden, 1, c.output).unwrap();
            out.poison().unwrap();
            layer.forward(&xt, &lt, &mut out).unwrap();
            let got = out.to_host().unwrap();
            let h = StepOnHost::of(&g, &layer.last_step().unwrap());
            let what = format!("case {n} step {step}");

            let (chosen, weights) = route(&logits, s.experts, s.top_k, c.scoring);
            assert_eq!(h.chosen, chosen, "{what}: the router's choices");
            // `ex2.approx` within 2^-22 of the power of its f32 argument, which the f32 product
            // and difference feeding it round by 2^-24 of its magnitude (|ln w| or the logit's,
            // at most: a relative error of 2^-24 · ln 2 · |x| in the power); the sums and the
            // quotient a few units of 2^-24; plus f32's smallest normal (results below it flush
            // to zero).
            for (i, (&w, &want)) in h.weights.iter().zip(&weights).enumerate() {
                // (A weight that is 0 in f64, a logit's exponent past its range: |ln w| is not
                // needed, the absolute term covers it.)
                let ln = if want > 0.0 { want.ln().abs() } else { 0.0 };
                let x = ln + logits[i / s.top_k * s.experts + chosen[i] as usize].abs() as f64;
                let tol = ((8 + s.top_k) as f64 + x) * 2f64.powi(-22);
                assert!(
                    (w as f64 - want).abs() <= tol * want + f32::MIN_POSITIVE as f64,
                    "{what}: weight {i} is {w:e}, want {want:e}"
                );
            }

            let (slot, groups) = slots(&chosen, s.experts, masked);
            assert_eq!(h.slot, slot, "{what}: the entries' rows");
            assert_eq!(h.groups, groups, "{what}: the groups");
            if c.group_capacity.is_some() {
                assert!(slot.contains(&-1), "{what}: the capacity drops entries");
            }
            // Each placed entry's grouped row is its token's row: codes and scales.
            let (gr, kb) = (h.grouped.rows(), s.hidden / 128);
            for (i, &sl) in slot.iter().enumerate() {
                if sl < 0 {
                    continue;
                }
                let (t, l, r) = (i / s.top_k, sl as usize / gr, sl as usize % gr);
                for k in 0..s.hidden {
                    assert_eq!(
                        h.grouped.code(l, r, k),
                        h.tokens.code(0, t, k),
                        "{what}: row {sl}"
                    );
                }
                for b in 0..kb {
                    assert_eq!(
                        h.grouped.scale_value(l, r, 128 * b).to_bits(),
                        h.tokens.scale_value(0, t, 128 * b).to_bits(),
                        "{what}: row {sl}'s scales"
                    );
                }
            }
            let rows = h.gate_up.m * h.gate_up.l;
            let experts = row_experts(&groups, c.layout, rows);
            check_grouped_rows(
                &format!("{what}: gate/up"),
                &h.grouped,
                &w1,
                &h.gate_up,
                &experts,
            )
            .unwrap();
            check_swiglu_rows(&h.hidden, &h.gate_up, &experts)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            check_grouped_rows(&format!("{what}: down"), &h.hidden, &w2, &h.down, &experts)
                .unwrap();

            let want = combine(
                &h.down,
                &h.weights,
                &slot,
                (c.tokens, s.top_k, s.hidden),
                c.output,
            );
            for (i, (&a, &b)) in got.values.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() && !a.is_nan(),
                    "{what}: output {i} is {a:e}, the host's {b:e}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn a_moe_layer_refuses_what_it_cannot_run() {
    let g = Gpu::new(0).unwrap();
    let fmt = Recipe::DeepSeekFp8.b();
    let s = MoeShape {
        hidden: 256,
        inter: 128,
        experts: 4,
        top_k: 2,
    };
    let w1 = g
        .upload(
            &ScaledMatrix::quantize(&random_values(1, 4 * 256 * 256, 256), 256, 256, 4, fmt)
                .unwrap(),
        )
        .unwrap();
    let w2 = g
        .upload(
            &ScaledMatrix::quantize(&random_values(2, 4 * 256 * 128, 128), 256, 128, 4, fmt)
                .unwrap(),
        )
        .unwrap();
    let bad = |s: MoeShape| MoeLayer::new(&g, s, &w1, &w2, MoeOptions::default()).is_err();
    assert!(bad(MoeShape { top_k: 5, ..s }), "top-k past the experts");
    assert!(
        bad(MoeShape { hidden: 200, ..s }),
        "hidden not a multiple of 128"
    );
    assert!(
        bad(MoeShape { experts: 8, ..s }),
        "weights of another expert count"
    );
    assert!(
        MoeLayer::new(&g, s, &w2, &w1, MoeOptions::default()).is_err(),
        "w1 and w2 swapped"
    );
    let mut layer = MoeLayer::new(&g, s, &w1, &w2, MoeOptions::default()).unwrap();
    let x = g
        .upload_tensor(&random_values(3, 8 * 256, 256), 8, 256, 1)
        .unwrap();
    let logits = random_values(4, 8 * 4, 4);
    let l32 = g.upload_tensor(&logits, 8, 4, 1).unwrap();
    let l16: Vec<half::bf16> = logits.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let lbf = g.upload_tensor(&l16, 8, 4, 1).unwrap();
    let mut out = g.output(8, 256, 1, OutType::Bf16).unwrap();
    assert!(layer.forward(&x, &lbf, &mut out).is_err(), "bf16 logits");
    let short = g.upload_tensor(&logits[..28], 7, 4, 1).unwrap();
    assert!(
        layer.forward(&x, &short, &mut out).is_err(),
        "logits for 7 of 8 tokens"
    );
    let mut wrong = g.output(8, 256, 1, OutType::F32).unwrap();
    assert!(
        layer.forward(&x, &l32, &mut wrong).is_err(),
        "an f32 output for a bf16 layer"
    );
    layer.forward(&x, &l32, &mut out).unwrap();
    let other = Gpu::new(0).unwrap();
    let x2 = other
        .upload_tensor(&random_values(5, 8 * 256, 256), 8, 256, 1)
        .unwrap();
    assert!(
        matches!(
            layer.forward(&x2, &l32, &mut out),
            Err(blockscaled::Error::WrongGpu(_))
        ),
        "tokens of another handle's GPU"
    );
}
