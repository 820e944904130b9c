//! The activations' arithmetic (SFU `ex2` and `rcp`).

use super::LOG2_E;
use crate::params::Activation;
use crate::ptx::math;

/// 1 / (1 + e^-z).
#[inline(always)]
pub(super) fn sigmoid(z: f32) -> f32 {
    math::recip_approx(1.0 + math::exp2_approx(-z * LOG2_E))
}

/// x · Φ(x), Φ from erfc by Abramowitz–Stegun 7.1.26 (no cancellation for negative x: Φ(x) is
/// the tail term itself there).
#[inline(always)]
pub(super) fn gelu_erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let z = (x * core::f32::consts::FRAC_1_SQRT_2).abs();
    let t = math::recip_approx(math::fma(P, z, 1.0));
    let mut poly = A[4];
    for a in A[..4].iter().rev() {
        poly = math::fma(poly, t, *a);
    }
    // Half of erfc(z): the tail of the normal distribution beyond |x|.
    let tail = 0.5 * poly * t * math::exp2_approx(-z * z * LOG2_E);
    x * if x < 0.0 { tail } else { 1.0 - tail }
}

/// The activation `act` ([`Activation`] as u32) of `x`; SwiGLU's gate part is SiLU.
#[inline(always)]
pub fn activate(act: u32, x: f32) -> f32 {
    if act == Activation::Relu as u32 {
        // NaN stays NaN (the comparison is false), −0 stays −0.
        if x < 0.0 { 0.0 } else { x }
    } else if act == Activation::GeluErf as u32 {
        gelu_erf(x)
    } else if act == Activation::GeluTanh as u32 {
        // 0.5·(1 + tanh(u)) = sigmoid(2u).
        let u = 0.797_884_6 * (x + 0.044_715 * (x * x * x));
        x * sigmoid(2.0 * u)
    } else if act == Activation::Silu as u32 || act == Activation::SwiGlu as u32 {
        x * sigmoid(x)
    } else {
        x
    }
}

/// [`activate`] of four values, the activation tested once for the four (one branch per row
/// rather than per element).
#[inline(always)]
pub(super) fn activate4(act: u32, x: [f32; 4]) -> [f32; 4] {
    // Each arm is `activate` with a constant, so its tests fold away.
    let (relu, erf, tanh, silu) = (
        Activation::Relu as u32,
        Activation::GeluErf as u32,
        Activation::GeluTanh as u32,
        Activation::Silu as u32,
    );
    if act == relu {
        x.map(|v| activate(relu, v))
    } else if act == erf {
        x.map(|v| activate(erf, v))
    } else if act == tanh {
        x.map(|v| activate(tanh, v))
    } else if act == silu || act == Activation::SwiGlu as u32 {
        x.map(|v| activate(silu, v))
    } else {
        x
    }
}
