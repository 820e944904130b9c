//! Host references for the mixture-of-experts layer (`blockscaled::MoeLayer`): the router's
//! choices and weights, where each entry's row goes, and each step's values checked against the
//! GPU's own inputs to that step, with bounds derived from the arithmetic.

use crate::compare_outputs;
use blockscaled::kernels::moe::order_key;
use blockscaled::{
    DeviceMatrix, DeviceOutput, Gpu, GroupLayout, HostOutput, MoeStep, OutType, ScaledMatrix,
    Scoring, round_output,
};

/// Each token's top-k experts (ties to the lower expert, NaN first) and their weights in f64.
pub fn route(logits: &[f32], experts: usize, k: usize, scoring: Scoring) -> (Vec<i32>, Vec<f64>) {
    let (mut chosen, mut weights) = (Vec::new(), Vec::new());
    for row in logits.chunks(experts) {
        let mut idx: Vec<usize> = (0..experts).collect();
        idx.sort_by_key(|&e| (std::cmp::Reverse(order_key(row[e].to_bits())), e));
        let top = &idx[..k];
        let score = |e: usize| {
            let l = row[e] as f64;
            match scoring {
                Scoring::Softmax => (l - row[top[0]] as f64).exp(),
                Scoring::Sigmoid => 1.0 / (1.0 + (-l).exp()),
            }
        };
        let sum: f64 = top.iter().map(|&e| score(e)).sum();
        for &e in top {
            chosen.push(e as i32);
            weights.push(score(e) / sum);
        }
    }
    (chosen, weights)
}

/// Each entry's row on one GPU: expert e's entries in entry order from its first row (contiguous:
/// after the earlier experts' entries; masked: `e · group_capacity`, −1 past the capacity).
pub fn slots(chosen: &[i32], experts: usize, masked: Option<usize>) -> (Vec<i32>, Vec<i32>) {
    let mut counts = vec![0i32; experts];
    let mut rank = vec![0i32; chosen.len()];
    for (i, &e) in chosen.iter().enumerate() {
        rank[i] = counts[e as usize];
        counts[e as usize] += 1;
    }
    let groups: Vec<i32> = match masked {
        Some(cap) => counts.iter().map(|&c| c.min(cap as i32)).collect(),
        None => counts
            .iter()
            .scan(0, |s, &c| {
                *s += c;
                Some(*s)
            })
            .collect(),
    };
    let slot = chosen
        .iter()
        .zip(&rank)
        .map(|(&e, &r)| match masked {
            Some(cap) if r >= cap as i32 => -1,
            Some(cap) => e * cap as i32 + r,
            None => groups[e as usize] - counts[e as usize] + r,
        })
        .collect();
    (slot, groups)
}

/// The device values of an i32 or f32 view.
pub fn download<T: cudarc::driver::DeviceRepr + Default + Clone>(
    gpu: &Gpu,
    v: &cudarc::driver::CudaView<'_, T>,
) -> Vec<T> {
    gpu.stream().clone_dtoh(v).expect("download")
}

/// Each grouped row's expert, or `None` for a row outside the groups.
pub fn row_experts(groups: &[i32], layout: GroupLayout, rows: usize) -> Vec<Option<usize>> {
    (0..rows)
        .map(|r| match layout {
            GroupLayout::Contiguous => groups.iter().position(|&end| (r as i32) < end),
            GroupLayout::Masked => {
                let cap = rows / groups.len();
                (((r % cap) as i32) < groups[r / cap]).then_some(r / cap)
            }
        })
        .collect()
}

/// Checks a grouped GEMM's output rows (`out`, flattened `[rows][n]`) against A's rows times
/// their experts' B in float64 ([`compare_outputs`]: one unit of the output type and one of f32
/// plus 2^-7 · Σ|ab|, FP8 accumulation: each 128-K block's products summed in the tensor cores'
/// reduced precision, then promoted); rows outside the groups are not compared.
pub fn check_grouped_rows(
    what: &str,
    a: &ScaledMatrix,
    b: &ScaledMatrix,
    out: &HostOutput,
    experts: &[Option<usize>],
) -> Result<(), String> {
    let (av, bv) = (a.dequantize(), b.dequantize());
    let (k, n) = (a.k(), b.rows());
    // Rows outside the groups hold whatever the buffer held: compared as zeros on both sides.
    let mut got = out.clone();
    let mut want = HostOutput {
        values: vec![0.0; out.values.len()],
        ..out.clone()
    };
    let mut slack = vec![0.0; out.values.len()];
    for (r, e) in experts.iter().enumerate() {
        let Some(e) = *e else {
            got.values[r * n..][..n].fill(0.0);
            continue;
        };
        let arow = &av[r * k..][..k];
        for c in 0..n {
            let brow = &bv[(e * n + c) * k..][..k];
            let (w, abs) = arow
                .iter()
                .zip(brow)
                .fold((0.0, 0.0), |(s, t), (x, y)| (s + x * y, t + (x * y).abs()));
            want.values[r * n + c] = round_output(out.dtype, w);
            slack[r * n + c] = abs / 128.0;
        }
    }
    compare_outputs(&got, &want, 1.0, &slack).map_err(|e| format!("{what}: {e}"))
}

/// Checks the SwiGLU rows (`hidden`, FP8 per 1×128) against silu(gate) · up of the gate/up
/// output's bf16 values in float64: each element within half an e4m3 unit of its value (2^-4
/// relative, 2^-10 of the scale below e4m3's normal range), plus 2^-19 of the block's largest
/// magnitude for the device's SiLU (`ex2.approx`, `rcp.approx`: a few units of 2^-22) and its
/// scale computed from those values.
pub fn check_swiglu_rows(
    hidden: &ScaledMatrix,
    gate_up: &HostOutput,
    experts: &[Option<usize>],
) -> Result<(), String> {
    let cols = hidden.k();
    let mut bad = 0;
    let mut first = String::new();
    for (r, e) in experts.iter().enumerate() {
        if e.is_none() {
            continue;
        }
        let (l, rr) = (r / hidden.rows(), r % hidden.rows());
        for block in 0..cols / 128 {
            let v: Vec<f64> = (0..128)
                .map(|i| {
                    let c = block * 128 + i;
                    let g = gate_up.values[r * 2 * cols + 2 * c] as f64;
                    let u = gate_up.values[r * 2 * cols + 2 * c + 1] as f64;
                    g / (1.0 + (-g).exp()) * u
                })
                .collect();
            let amax = v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let scale = hidden.scale_value(l, rr, block * 128);
            for (i, want) in v.iter().enumerate() {
                let got = hidden.value(l, rr, block * 128 + i);
                let tol = want.abs() / 16.0 + scale / 1024.0 + amax * 2f64.powi(-19);
                if got.is_nan() || (got - want).abs() > tol {
                    bad += 1;
                    if first.is_empty() {
                        first = format!(
                            "row {r} col {}: got {got:e}, want {want:e}",
                            block * 128 + i
                        );
                    }
                }
            }
            let want_scale = if amax == 0.0 { 1.0 } else { amax / 448.0 };
            if (scale - want_scale).abs() > want_scale * 2f64.powi(-18) {
                bad += 1;
                if first.is_empty() {
                    first = format!("row {r} block {block}: scale {scale:e}, want {want_scale:e}");
                }
            }
        }
    }
    if bad == 0 {
        Ok(())
    } else {
        Err(format!("SwiGLU rows: {bad} mismatches; first {first}"))
    }
}

/// The combined output the host computes from the device's down rows, weights and slots: each
/// token's Σ_j w_j · row(slot_j) as the kernel forms it (one f32 fused multiply-add per choice,
/// in order), rounded to `dtype`.
pub fn combine(
    down: &HostOutput,
    weights: &[f32],
    slot: &[i32],
    (tokens, k, hidden): (usize, usize, usize),
    dtype: OutType,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(tokens * hidden);
    for t in 0..tokens {
        for c in 0..hidden {
            let mut acc = 0f32;
            for j in 0..k {
                let s = slot[t * k + j];
                if s >= 0 {
                    acc = weights[t * k + j].mul_add(down.values[s as usize * hidden + c], acc);
                }
            }
            out.push(match dtype {
                OutType::Bf16 => half::bf16::from_f32(acc).to_f32(),
                _ => acc,
            });
        }
    }
    out
}

/// The host copies of a step's matrices and outputs.
pub struct StepOnHost {
    pub chosen: Vec<i32>,
    pub weights: Vec<f32>,
    pub slot: Vec<i32>,
    pub groups: Vec<i32>,
    pub tokens: ScaledMatrix,
    pub grouped: ScaledMatrix,
    pub gate_up: HostOutput,
    pub hidden: ScaledMatrix,
    pub down: HostOutput,
}

impl StepOnHost {
    pub fn of(gpu: &Gpu, s: &MoeStep<'_>) -> StepOnHost {
        let m = |x: &DeviceMatrix| x.to_host().expect("matrix to host");
        let o = |x: &DeviceOutput| x.to_host().expect("output to host");
        StepOnHost {
            chosen: download(gpu, &s.chosen),
            weights: download(gpu, &s.weights),
            slot: download(gpu, &s.slot),
            groups: download(gpu, &s.groups.values().expect("the layer's own groups")),
            tokens: m(s.tokens),
            grouped: m(s.grouped),
            gate_up: o(s.gate_up),
            hidden: m(s.hidden),
            down: o(s.down),
        }
    }
}
