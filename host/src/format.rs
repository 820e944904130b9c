//! Block-scaled formats: an element type, a scale type, and the block of elements one scale covers.
//!
//! | recipe | A elements | A scales | B elements | B scales | tensor scale |
//! |---|---|---|---|---|---|
//! | [`Recipe::Mxfp8`] | e4m3 or e5m2 | e8m0 per 1×32 | same | e8m0 per 1×32 | — |
//! | [`Recipe::Mxfp4`] | e2m1 | e8m0 per 1×32 | e2m1 | e8m0 per 1×32 | — |
//! | [`Recipe::Nvfp4`] | e2m1 | ue4m3 per 1×16 | e2m1 | ue4m3 per 1×16 | fp32 per operand |
//! | [`Recipe::E2m1E8m0x16`] | e2m1 | e8m0 per 1×16 | e2m1 | e8m0 per 1×16 | — |
//! | [`Recipe::DeepSeekFp8`] | e4m3 | fp32 per 1×128 | e4m3 | fp32 per 128×128 | — |
//! | [`Recipe::Fp8PerTensor`] | e4m3 or e5m2 | fp32 per matrix | same | fp32 per matrix | — |
//! | [`Recipe::Fp8PerRow`] | e4m3 or e5m2 | fp32 per row of A | same | fp32 per row of B (column of C) | — |
//! | [`Recipe::W4A16`] | bf16 | fp32 per matrix (1) | e2m1 | as MXFP4 or NVFP4 | B's, if NVFP4 |
//! | [`Recipe::W4A8`] | e4m3 | fp32 per 1×128 | e2m1 | as MXFP4 or NVFP4 | B's, if NVFP4 |
//!
//! "1×32" means one scale per 32 consecutive elements along K of one row; "128×128" one scale per
//! 128 rows × 128 K. The last block of a row (or of the rows) may be partial.

use std::fmt;

use crate::error::Error;

pub use blockscaled_kernels::format::{ElemType, ScaleType};
pub use blockscaled_kernels::params::OutType;

/// How many elements share one scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleBlock {
    /// One scale for the whole matrix (per batch entry).
    PerTensor,
    /// One scale per row (all of K).
    PerRow,
    /// One scale per `rows` × `k` tile.
    Tile {
        /// Rows one scale covers.
        rows: u32,
        /// K one scale covers.
        k: u32,
    },
}

impl ScaleBlock {
    /// (rows per block, K per block) for a matrix of `rows` × `k`.
    pub fn extent(self, rows: usize, k: usize) -> (usize, usize) {
        match self {
            ScaleBlock::PerTensor => (rows.max(1), k.max(1)),
            ScaleBlock::PerRow => (1, k.max(1)),
            ScaleBlock::Tile { rows: r, k: kk } => (r as usize, kk as usize),
        }
    }
}

/// The format of one operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OperandFormat {
    /// The element type.
    pub elem: ElemType,
    /// The scales' type.
    pub scale: ScaleType,
    /// What one scale covers.
    pub block: ScaleBlock,
    /// Whether a second-level fp32 scale for the whole tensor is part of the format (NVFP4).
    pub tensor_scale: bool,
}

impl OperandFormat {
    /// Checks that the combination is one this crate quantizes and computes with.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(self.error(m));
        match self.block {
            ScaleBlock::Tile { rows: 0, .. } | ScaleBlock::Tile { k: 0, .. } => {
                return bad("a scale block cannot be empty");
            }
            _ => {}
        }
        if self.elem.is_16bit() {
            return if self.scale == ScaleType::F32 && self.block == ScaleBlock::PerTensor {
                Ok(())
            } else {
                bad("bf16 and fp16 operands carry one fp32 scale per tensor (1 when quantized)")
            };
        }
        match (self.elem, self.scale) {
            // Power-of-two and e4m3 scales are what MX / NVFP4 define; fp32 scales are the
            // DeepSeek / per-tensor / per-row recipes for fp8.
            (_, ScaleType::E8M0) | (ElemType::E2M1, ScaleType::UE4M3) => {}
            (ElemType::E4M3 | ElemType::E5M2, ScaleType::F32) => {}
            (ElemType::BF16 | ElemType::F16, _) => unreachable!("checked above"),
            (ElemType::E2M1, ScaleType::F32) => {
                return bad("e2m1 with fp32 scales is not a supported recipe");
            }
            (_, ScaleType::UE4M3) => {
                return bad("ue4m3 scales are defined for e2m1 elements (NVFP4) only");
            }
        }
        if self.tensor_scale && self.scale != ScaleType::UE4M3 {
            return bad("a second-level tensor scale belongs to NVFP4 (ue4m3 block scales) only");
        }
        Ok(())
    }
}

impl OperandFormat {
    /// An [`Error::Format`] that names this format.
    pub(crate) fn error(&self, msg: impl fmt::Display) -> Error {
        Error::Format(format!("{self}: {msg}"))
    }
}

impl fmt::Display for OperandFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let block = match self.block {
            ScaleBlock::PerTensor => "tensor".to_string(),
            ScaleBlock::PerRow => "row".to_string(),
            ScaleBlock::Tile { rows, k } => format!("{rows}x{k}"),
        };
        write!(
            f,
            "{} + {} per {}",
            self.elem.name(),
            self.scale.name(),
            block
        )?;
        if self.tensor_scale {
            write!(f, " + fp32 tensor scale")?;
        }
        Ok(())
    }
}

/// FP8 element type choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp8 {
    /// e4m3 (OCP FP8: 4 exponent bits, 3 mantissa bits, largest 448).
    E4M3,
    /// e5m2 (5 exponent bits, 2 mantissa bits, largest 57344).
    E5M2,
}

impl Fp8 {
    /// The element type of this FP8 kind.
    pub fn elem(self) -> ElemType {
        match self {
            Fp8::E4M3 => ElemType::E4M3,
            Fp8::E5M2 => ElemType::E5M2,
        }
    }
}

/// The 4-bit weights of a weight-only recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fp4Weights {
    /// MXFP4: e2m1 with e8m0 scales per 1×32.
    Mxfp4,
    /// NVFP4: e2m1 with ue4m3 scales per 1×16 and an fp32 tensor scale.
    Nvfp4,
}

impl Fp4Weights {
    fn recipe(self) -> Recipe {
        match self {
            Fp4Weights::Mxfp4 => Recipe::Mxfp4,
            Fp4Weights::Nvfp4 => Recipe::Nvfp4,
        }
    }
}

/// The recipes people use; each fixes the format of A and of B.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Recipe {
    /// OCP MXFP8: e4m3 or e5m2 elements, e8m0 scale per 1×32.
    Mxfp8(Fp8),
    /// OCP MXFP4: e2m1 elements, e8m0 scale per 1×32.
    Mxfp4,
    /// NVIDIA NVFP4: e2m1 elements, ue4m3 scale per 1×16, fp32 tensor scale.
    Nvfp4,
    /// e2m1 elements with e8m0 scale per 1×16 (CUTLASS's `sf_vec_size 16` with e8m0 scales).
    E2m1E8m0x16,
    /// DeepSeek-V3 FP8: e4m3; fp32 scales per 1×128 of A (activations), 128×128 of B (weights).
    DeepSeekFp8,
    /// FP8 with one fp32 scale per matrix.
    Fp8PerTensor(Fp8),
    /// FP8 with one fp32 scale per row of A and per row of B (per output column).
    Fp8PerRow(Fp8),
    /// Weight-only 4-bit: A (activations) bf16, B (weights) MXFP4 or NVFP4.
    W4A16(Fp4Weights),
    /// 4-bit weights with FP8 activations: A e4m3 with fp32 scales per 1×128 (as DeepSeek's
    /// activations), B MXFP4 or NVFP4.
    W4A8(Fp4Weights),
}

impl Recipe {
    /// Every recipe, for tests and the runner.
    pub const ALL: [Recipe; 14] = [
        Recipe::Mxfp8(Fp8::E4M3),
        Recipe::Mxfp8(Fp8::E5M2),
        Recipe::Mxfp4,
        Recipe::Nvfp4,
        Recipe::E2m1E8m0x16,
        Recipe::DeepSeekFp8,
        Recipe::Fp8PerTensor(Fp8::E4M3),
        Recipe::Fp8PerTensor(Fp8::E5M2),
        Recipe::Fp8PerRow(Fp8::E4M3),
        Recipe::Fp8PerRow(Fp8::E5M2),
        Recipe::W4A16(Fp4Weights::Mxfp4),
        Recipe::W4A16(Fp4Weights::Nvfp4),
        Recipe::W4A8(Fp4Weights::Mxfp4),
        Recipe::W4A8(Fp4Weights::Nvfp4),
    ];

    /// A's format (the activations).
    pub fn a(self) -> OperandFormat {
        self.operand(false)
    }

    /// B's format (the weights).
    pub fn b(self) -> OperandFormat {
        self.operand(true)
    }

    fn operand(self, is_b: bool) -> OperandFormat {
        let f = |elem, scale, block| OperandFormat {
            elem,
            scale,
            block,
            tensor_scale: false,
        };
        let tile = |rows, k| ScaleBlock::Tile { rows, k };
        match self {
            Recipe::Mxfp8(e) => f(e.elem(), ScaleType::E8M0, tile(1, 32)),
            Recipe::Mxfp4 => f(ElemType::E2M1, ScaleType::E8M0, tile(1, 32)),
            Recipe::Nvfp4 => OperandFormat {
                tensor_scale: true,
                ..f(ElemType::E2M1, ScaleType::UE4M3, tile(1, 16))
            },
            Recipe::E2m1E8m0x16 => f(ElemType::E2M1, ScaleType::E8M0, tile(1, 16)),
            Recipe::DeepSeekFp8 if is_b => f(ElemType::E4M3, ScaleType::F32, tile(128, 128)),
            Recipe::DeepSeekFp8 => f(ElemType::E4M3, ScaleType::F32, tile(1, 128)),
            Recipe::Fp8PerTensor(e) => f(e.elem(), ScaleType::F32, ScaleBlock::PerTensor),
            Recipe::Fp8PerRow(e) => f(e.elem(), ScaleType::F32, ScaleBlock::PerRow),
            Recipe::W4A16(w) if is_b => w.recipe().b(),
            Recipe::W4A16(_) => f(ElemType::BF16, ScaleType::F32, ScaleBlock::PerTensor),
            Recipe::W4A8(w) if is_b => w.recipe().b(),
            Recipe::W4A8(_) => Recipe::DeepSeekFp8.a(),
        }
    }

    /// Short name used by the runner (`--recipe`) and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Recipe::Mxfp8(Fp8::E4M3) => "mxfp8-e4m3",
            Recipe::Mxfp8(Fp8::E5M2) => "mxfp8-e5m2",
            Recipe::Mxfp4 => "mxfp4",
            Recipe::Nvfp4 => "nvfp4",
            Recipe::E2m1E8m0x16 => "e2m1-e8m0x16",
            Recipe::DeepSeekFp8 => "deepseek-fp8",
            Recipe::Fp8PerTensor(Fp8::E4M3) => "fp8-e4m3-tensor",
            Recipe::Fp8PerTensor(Fp8::E5M2) => "fp8-e5m2-tensor",
            Recipe::Fp8PerRow(Fp8::E4M3) => "fp8-e4m3-row",
            Recipe::Fp8PerRow(Fp8::E5M2) => "fp8-e5m2-row",
            Recipe::W4A16(Fp4Weights::Mxfp4) => "w4a16-mxfp4",
            Recipe::W4A16(Fp4Weights::Nvfp4) => "w4a16-nvfp4",
            Recipe::W4A8(Fp4Weights::Mxfp4) => "w4a8-mxfp4",
            Recipe::W4A8(Fp4Weights::Nvfp4) => "w4a8-nvfp4",
        }
    }

    /// The recipe a name of [`Recipe::name`] (or the runner's spelling) names.
    pub fn from_name(s: &str) -> Option<Recipe> {
        Recipe::ALL.into_iter().find(|r| r.name() == s)
    }
}

impl fmt::Display for Recipe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which index of the scale tensor is contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleMajor {
    /// `(row_block, k_block)` row-major: the K blocks of one row are adjacent. The un-swizzled MX /
    /// NVFP4 layout (torch's `(M, K/32)` scale tensor before `to_blocked`), and DeepGEMM's and
    /// torch's `(N/128, K/128)` weight scales.
    K,
    /// The row blocks of one K block are adjacent: torch `_scaled_mm`'s 1×128 activation scales
    /// (shape `(M, K/128)`, strides `(1, M)`) and DeepGEMM's MN-major `sfa`.
    Mn,
}

impl ScaleMajor {
    /// The layout a recipe's users pass by default for this operand.
    pub fn default_for(fmt: &OperandFormat) -> ScaleMajor {
        match (fmt.scale, fmt.block) {
            (ScaleType::F32, ScaleBlock::Tile { rows: 1, .. }) => ScaleMajor::Mn,
            _ => ScaleMajor::K,
        }
    }
}
