//! Kernel entry points: one file per kernel family (the DeepGEMM habit).
//! Each kernel's name, block size and launch bounds are listed in `crate::registry`.

pub mod reference;
