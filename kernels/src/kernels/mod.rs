//! Kernel entry points: one file per kernel family (the DeepGEMM habit).
//! Each kernel's name, block size, launch bounds and targets are listed in `crate::registry`.

pub mod reference;
#[cfg(target_feature = "sm_90a")]
pub mod sm90_fp8;
pub mod splitk;
