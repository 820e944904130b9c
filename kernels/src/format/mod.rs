//! Bit-exact element and scale formats of block-scaled GEMM (MXFP8, MXFP4, NVFP4).
//!
//! Everything here uses only `core` integer and bit operations (no `libm`, no `f64`), so the
//! host (quantizer, reference GEMM) and the GPU kernels (`nvptx64-nvidia-cuda`) compile the
//! same source and can never disagree on a rounding rule.
//!
//! # Sources
//! - **OFP8**: *OCP 8-bit Floating Point Specification (OFP8)*, Revision 1.0, 2023-06-20:
//!   §5.1 "OFP8 Binary Interchange Formats" (E4M3 and E5M2 encodings, Table 1 and 2),
//!   §5.2 "Conversion Behavior" / §5.2.1 "Conversion Arithmetic" (round to nearest even,
//!   saturating and non-saturating modes).
//! - **MX**: *OCP Microscaling Formats (MX) Specification*, v1.0, 2023-09:
//!   §5.3 "Element data types" (§5.3.3 FP4 E2M1), §5.4 "Scale data types" (§5.4.1 E8M0),
//!   §6.3 "Conversion from vector of scalar floating-point to MX format" (Algorithm 1:
//!   `shared_exp = floor(log2(max|V_i|)) - emax_elem`, elements quantized with saturation).
//! - **NVFP4**: NVIDIA, "Introducing NVFP4 for efficient and accurate low-precision
//!   inference" and the CUDA/cuBLASLt block-scaling docs: E2M1 elements, one unsigned E4M3
//!   (UE4M3) scale per 16 elements, one FP32 per-tensor scale.
//! - **FP4 packing**: CUDA `cuda_fp4.h` `__nv_fp4x2_e2m1` and PyTorch `torch.float4_e2m1fn_x2`
//!   (pytorch/pytorch#146414, #148791), CUTLASS `float_e2m1_t` subbyte arrays: element `2i` is
//!   in the **low** nibble (bits 0–3) and element `2i+1` in the **high** nibble (bits 4–7).
//!
//! # Formats
//!
//! | format | bits (S.E.M) | bias | max finite | min normal | min subnormal | special values |
//! |--------|--------------|------|------------|------------|---------------|----------------|
//! | [`e2m1`] (FP4)          | 4 (1.2.1) | 1   | 6          | 1 = 2^0     | 0.5 = 2^-1   | none: no Inf, no NaN; ±0 |
//! | [`e4m3`] (OFP8 E4M3FN)  | 8 (1.4.3) | 7   | 448        | 2^-6        | 2^-9         | NaN = S.1111.111 (0x7F/0xFF); no Inf; ±0 |
//! | [`e5m2`] (OFP8 E5M2)    | 8 (1.5.2) | 15  | 57344      | 2^-14       | 2^-16        | ±Inf = 0x7C/0xFC; NaN = S.11111.{01,10,11}; ±0 |
//! | [`e8m0`] (MX scale)     | 8 (0.8.0) | 127 | 2^127      | 2^-127 (all codes are powers of two) | — | NaN = 0xFF; no zero, no sign, no Inf |
//! | [`ue4m3`] (NVFP4 scale) | 8 (0.4.3), sign bit 0 | 7 | 448 | 2^-6     | 2^-9         | NaN = 0x7F; sign bit ignored |
//!
//! Every encoder (`encode_sat`) rounds to nearest, ties to even, directly from the `f32` bits
//! (one rounding), and saturates: finite magnitudes above the maximum and ±Inf become ±max
//! (OFP8 §5.2 saturating mode, as used by MX §6.3 and NVFP4 quantization).
//!
//! # Packing
//! E2M1 codes are packed two per byte, element `2i` in bits 0–3 and element `2i+1` in bits 4–7
//! ([`e2m1::pack`], [`e2m1::unpack`]). E4M3, E5M2, E8M0 and UE4M3 codes are one byte each.

pub mod bf16;
pub mod e2m1;
pub mod e4m3;
pub mod e5m2;
pub mod e8m0;
pub mod f16;
pub mod fold;
pub mod quantize;
pub mod swizzle;
pub mod ue4m3;

/// `2^e` as an `f32`, exact for `-149 <= e <= 127` (subnormal results included);
/// `0.0` below that range and `+Inf` above it.
#[inline]
pub(crate) const fn pow2(e: i32) -> f32 {
    if e > 127 {
        f32::INFINITY
    } else if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else if e >= -149 {
        f32::from_bits(1u32 << ((e + 149) as u32))
    } else {
        0.0
    }
}

/// `floor(log2(a))` of a positive, finite, non-zero `f32` given by its bits (sign ignored),
/// exact, subnormals included. Returns `i32::MIN` for zero.
#[inline]
pub(crate) const fn floor_log2_bits(bits: u32) -> i32 {
    let mag = bits & 0x7FFF_FFFF;
    let e32 = (mag >> 23) as i32;
    if e32 != 0 {
        e32 - 127
    } else if mag == 0 {
        i32::MIN
    } else {
        // value = mag * 2^-149, mag < 2^23.
        (31 - mag.leading_zeros() as i32) - 149
    }
}

/// Shift `v` right by `s` bits (`1 <= s`), rounding to nearest, ties to even.
#[inline]
const fn shr_rne(v: u32, s: u32) -> u32 {
    if s >= 32 {
        // v < 2^32 <= 2^s: v / 2^s < 1; it is exactly one half only if s == 32 and v == 2^31,
        // which rounds to the even 0 anyway.
        return 0;
    }
    let q = v >> s;
    let rem = v & ((1u32 << s) - 1);
    let half = 1u32 << (s - 1);
    if rem > half || (rem == half && (q & 1) == 1) {
        q + 1
    } else {
        q
    }
}

/// Saturating RNE encode of a signed 8-bit float (e4m3, e5m2): the sign bit is bit 7, NaN maps to
/// `nan | sign`, magnitudes round with [`rne_mag_code`] and clamp at `max_code` (±Inf included).
#[inline]
pub(crate) fn encode_sat_signed8(
    x: f32,
    mantissa_bits: u32,
    emin: i32,
    max_code: u32,
    nan: u8,
) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 31) << 7) as u8;
    if x.is_nan() {
        return nan | sign;
    }
    let q = rne_mag_code(bits & 0x7FFF_FFFF, mantissa_bits, emin);
    let q = if q > max_code { max_code } else { q };
    q as u8 | sign
}

/// Magnitude code (sign bit clear) of the nearest (ties to even) value of a binary format with
/// `m` mantissa bits and minimum normal exponent `emin` to the finite, non-NaN `f32` magnitude
/// `mag` (bits with the sign cleared), **before** saturation: the result may exceed the format's
/// largest finite code (the caller clamps). Exponent field `k >= 1` means `2^(k - bias)`,
/// `bias = 1 - emin`. Infinity (`mag == 0x7F80_0000`) yields a code above any format's maximum.
///
/// One rounding step on the full 24-bit `f32` significand (OFP8 §5.2.1: round to nearest even).
#[inline]
pub(crate) const fn rne_mag_code(mag: u32, m: u32, emin: i32) -> u32 {
    let e32 = (mag >> 23) as i32;
    let frac = mag & 0x007F_FFFF;
    // value = sig * 2^(e - 23)
    let (sig, e) = if e32 == 0 {
        (frac, -126)
    } else {
        (frac | 0x0080_0000, e32 - 127)
    };
    if e >= emin {
        // Normal in the target: keep m fraction bits of the 24-bit significand. The rounded
        // significand includes the implicit bit (2^m <= r <= 2^(m+1)); adding it onto the
        // exponent field `(e + bias - 1) << m` carries into the exponent when r == 2^(m+1).
        let r = shr_rne(sig, 23 - m);
        let bias = 1 - emin;
        (((e + bias - 1) as u32) << m) + r
    } else {
        // Below the smallest normal: count units of the subnormal spacing 2^(emin - m).
        // value / 2^(emin - m) = sig * 2^(e - 23 - emin + m), shift = 23 + emin - m - e > 23 - m.
        let s = (23 + emin - m as i32 - e) as u32;
        // A result of 2^m lands on the smallest normal code, which is correct.
        shr_rne(sig, s)
    }
}

/// Exact value of a magnitude code (sign bit excluded, no special values) of a binary format
/// with `m` mantissa bits and minimum normal exponent `emin`: exponent field `k = mag >> m`,
/// fraction `f`; `k == 0` is subnormal `f * 2^(emin - m)`, else `(1 + f/2^m) * 2^(k - bias)`
/// with `bias = 1 - emin`. All values of the formats here are normal `f32`s, so the result is
/// built from bits (the subnormal product is exact: a small integer times a power of two).
#[inline]
pub(crate) fn decode_mag(mag: u32, m: u32, emin: i32) -> f32 {
    let k = mag >> m;
    let f = mag & ((1u32 << m) - 1);
    if k == 0 {
        (f as f32) * pow2(emin - m as i32)
    } else {
        let e = k as i32 - (1 - emin);
        f32::from_bits((((e + 127) as u32) << 23) | (f << (23 - m)))
    }
}

/// `v` with its sign bit set when `neg`.
#[inline]
pub(crate) fn with_sign(v: f32, neg: bool) -> f32 {
    f32::from_bits(v.to_bits() | ((neg as u32) << 31))
}

/// Spacing of a binary format with `m` mantissa bits, normal exponents `emin..=emax`, at
/// magnitude `|v|`: `2^(emin - m)` below `2^emin`, `2^(floor(log2|v|) - m)` in the normal range,
/// and the top binade's `2^(emax - m)` at and above `2^emax` (Inf included). NaN gives NaN.
#[inline]
pub(crate) fn ulp_generic(v: f32, m: u32, emin: i32, emax: i32) -> f32 {
    if v.is_nan() {
        return f32::NAN;
    }
    let e = floor_log2_bits(v.to_bits());
    let e = if e < emin {
        emin
    } else if e > emax {
        emax
    } else {
        e
    };
    pow2(e - m as i32)
}

/// Element data type of a block-scaled operand. Stable `u32` values (passed to kernels).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemType {
    /// OFP8 E4M3 (E4M3FN), [`e4m3`].
    E4M3 = 0,
    /// OFP8 E5M2, [`e5m2`].
    E5M2 = 1,
    /// MX FP4 E2M1, [`e2m1`] (two codes per byte, low nibble first).
    E2M1 = 2,
    /// bfloat16, [`bf16`] (two bytes per code, little-endian): W4A16's activations and the
    /// 16-bit GEMMs' operands.
    BF16 = 3,
    /// IEEE binary16, [`f16`] (two bytes per code, little-endian): the 16-bit GEMMs' operands.
    F16 = 4,
}

impl ElemType {
    /// Storage bits per element (4, 8 or 16).
    #[inline]
    pub const fn bits(self) -> u32 {
        match self {
            ElemType::E4M3 => e4m3::BITS,
            ElemType::E5M2 => e5m2::BITS,
            ElemType::E2M1 => e2m1::BITS,
            ElemType::BF16 => bf16::BITS,
            ElemType::F16 => f16::BITS,
        }
    }

    /// The unscaled 16-bit types (bf16, fp16): one fp32 scale per tensor, two bytes per code.
    #[inline]
    pub const fn is_16bit(self) -> bool {
        matches!(self, ElemType::BF16 | ElemType::F16)
    }

    /// Largest finite value.
    #[inline]
    pub const fn max(self) -> f32 {
        match self {
            ElemType::E4M3 => e4m3::MAX,
            ElemType::E5M2 => e5m2::MAX,
            ElemType::E2M1 => e2m1::MAX,
            ElemType::BF16 => bf16::MAX,
            ElemType::F16 => f16::MAX,
        }
    }

    /// Exponent of the largest power of two <= [`max`](Self::max) (`emax_elem` of MX §6.3).
    #[inline]
    pub const fn emax(self) -> i32 {
        match self {
            ElemType::E4M3 => e4m3::EMAX,
            ElemType::E5M2 => e5m2::EMAX,
            ElemType::E2M1 => e2m1::EMAX,
            ElemType::BF16 => bf16::EMAX,
            ElemType::F16 => f16::EMAX,
        }
    }

    /// Exponent of the smallest normal value.
    #[inline]
    pub const fn emin(self) -> i32 {
        match self {
            ElemType::E4M3 => e4m3::EMIN,
            ElemType::E5M2 => e5m2::EMIN,
            ElemType::E2M1 => e2m1::EMIN,
            ElemType::BF16 => bf16::EMIN,
            ElemType::F16 => f16::EMIN,
        }
    }

    /// Explicit mantissa (fraction) bits.
    #[inline]
    pub const fn mantissa_bits(self) -> u32 {
        match self {
            ElemType::E4M3 => e4m3::MANTISSA_BITS,
            ElemType::E5M2 => e5m2::MANTISSA_BITS,
            ElemType::E2M1 => e2m1::MANTISSA_BITS,
            ElemType::BF16 => bf16::MANTISSA_BITS,
            ElemType::F16 => f16::MANTISSA_BITS,
        }
    }

    /// Exact value of `code` (for E2M1 only the low 4 bits are used, for the 8-bit types the low
    /// 8).
    #[inline]
    pub fn decode(self, code: u32) -> f32 {
        match self {
            ElemType::E4M3 => e4m3::decode(code as u8),
            ElemType::E5M2 => e5m2::decode(code as u8),
            ElemType::E2M1 => e2m1::decode(code as u8),
            ElemType::BF16 => bf16::decode(code as u16),
            ElemType::F16 => f16::decode(code as u16),
        }
    }

    /// Round to nearest even with saturation (see the per-format `encode_sat`).
    #[inline]
    pub fn encode_sat(self, x: f32) -> u32 {
        match self {
            ElemType::E4M3 => e4m3::encode_sat(x) as u32,
            ElemType::E5M2 => e5m2::encode_sat(x) as u32,
            ElemType::E2M1 => e2m1::encode_sat(x) as u32,
            ElemType::BF16 => bf16::encode_sat(x) as u32,
            ElemType::F16 => f16::encode_sat(x) as u32,
        }
    }

    /// Spacing of representable values at magnitude `|v|` (see the per-format `ulp`).
    #[inline]
    pub fn ulp(self, v: f32) -> f32 {
        match self {
            ElemType::E4M3 => e4m3::ulp(v),
            ElemType::E5M2 => e5m2::ulp(v),
            ElemType::E2M1 => e2m1::ulp(v),
            ElemType::BF16 => bf16::ulp(v),
            ElemType::F16 => f16::ulp(v),
        }
    }

    /// Short lower-case name: `"e4m3"`, `"e5m2"`, `"e2m1"`, `"bf16"`, `"f16"`.
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            ElemType::E4M3 => "e4m3",
            ElemType::E5M2 => "e5m2",
            ElemType::E2M1 => "e2m1",
            ElemType::BF16 => "bf16",
            ElemType::F16 => "f16",
        }
    }

    /// Inverse of `self as u32`.
    #[inline]
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(ElemType::E4M3),
            1 => Some(ElemType::E5M2),
            2 => Some(ElemType::E2M1),
            3 => Some(ElemType::BF16),
            4 => Some(ElemType::F16),
            _ => None,
        }
    }
}

/// Block-scale data type. Stable `u32` values (passed to kernels).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleType {
    /// MX E8M0 power-of-two scale, [`e8m0`].
    E8M0 = 0,
    /// NVFP4 unsigned E4M3 scale, [`ue4m3`].
    UE4M3 = 1,
    /// Plain IEEE `f32` scale.
    F32 = 2,
}

impl ScaleType {
    /// Storage bytes per scale (1, 1, 4).
    #[inline]
    pub const fn bytes(self) -> usize {
        match self {
            ScaleType::E8M0 => 1,
            ScaleType::UE4M3 => 1,
            ScaleType::F32 => 4,
        }
    }

    /// Value of a stored scale. For the one-byte formats only the low 8 bits of `bits` are
    /// used; for [`ScaleType::F32`] it is `f32::from_bits(bits)`.
    #[inline]
    pub fn decode_bits(self, bits: u32) -> f32 {
        match self {
            ScaleType::E8M0 => e8m0::decode(bits as u8),
            ScaleType::UE4M3 => ue4m3::decode(bits as u8),
            ScaleType::F32 => f32::from_bits(bits),
        }
    }

    /// Short lower-case name: `"e8m0"`, `"ue4m3"`, `"f32"`.
    #[inline]
    pub const fn name(self) -> &'static str {
        match self {
            ScaleType::E8M0 => "e8m0",
            ScaleType::UE4M3 => "ue4m3",
            ScaleType::F32 => "f32",
        }
    }

    /// Inverse of `self as u32`.
    #[inline]
    pub const fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(ScaleType::E8M0),
            1 => Some(ScaleType::UE4M3),
            2 => Some(ScaleType::F32),
            _ => None,
        }
    }
}

/// A one-byte scale format as the MX-style kernels take it: the scale's type and the elements
/// each scale covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MxScale {
    pub ty: ScaleType,
    pub block: u32,
}

impl MxScale {
    pub const E8M0X32: MxScale = MxScale {
        ty: ScaleType::E8M0,
        block: 32,
    };
    pub const E8M0X16: MxScale = MxScale {
        ty: ScaleType::E8M0,
        block: 16,
    };
    pub const UE4M3X16: MxScale = MxScale {
        ty: ScaleType::UE4M3,
        block: 16,
    };
}
