//! The one mechanism by which a family declares its kernels: `kernel_table!` turns a table of
//! rows into the family's list of kernels (host and device, the registry's rows) and, on the GPU
//! targets, into one exported entry point per row, so that a kernel is one line of one table
//! and its entry point can never be missing from the list, or named otherwise.
//!
//! A row is a value of the family's kernel type (`Sm90Fp8Kernel`, `QuantizeKernel`, …) made by
//! a `const fn` of the family from the entry point's name and the kernel's parameters (tile,
//! element types, mode …). The entry point's code is the family's, written once above its
//! rows in terms of the row's constant (`K` below); each row says which of the few kinds of entry
//! point it has:
//! - `plain`: the GEMM kernel type of the `gemm` template, taking the family's parameters, with
//!   the plain epilogue ([`crate::params::EpilogueParams::plain`]);
//! - `fused`: the same kernel type taking [`crate::params::FusedParams`] (the family's
//!   parameters and the fused epilogue's);
//! - `bare`: the kernel type of the `bare` template, made of the family's parameters alone;
//! - `call`: a call of the device function of the `call` template with the parameters.
//!
//! GEMM entry points take [`crate::params::Mapped`] (the launch's tensor maps, then the family's
//! parameters) and run `gemm::driver::run` with the register budgets of the row's
//! `producer_regs()` and `consumer_regs()` (a `const fn` of each GEMM family's kernel type), and
//! check that a `plain` row's kernel has no fused epilogue and a `fused` row's has one
//! (`fused()`). Where a kernel type takes a type the row holds as a value (an element type, a
//! scale format), the template names it through [`Of`].
//!
//! ```ignore
//! kernel_table! {
//!     /// # Safety
//!     /// (the launch's contract: the doc of every entry point)
//!     #[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
//!     unsafe extern "ptx-kernel" fn |K| {
//!         gemm(Sm90Fp8Params) => fp8::Fp8Gemm<
//!             { K.tile.consumers },
//!             { K.tile.waves as usize },
//!             [f32; K.tile.block_n as usize / 2],
//!             Fp8<{ K.a as u32 }, { K.b as u32 }>,
//!             { K.mode as u32 },
//!         >;
//!     }
//!
//!     /// The dense kernels (the registry's rows).
//!     pub const KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
//!         plain("sm90_fp8_blockscaled_gemm", Tile::M128, E4M3, E4M3, Dense),
//!         plain("sm90_fp8_blockscaled_gemm_m256", Tile::M256, E4M3, E4M3, Dense),
//!     ];
//!     /// The fused-epilogue kernels.
//!     pub const FUSED_KERNELS: &[Sm90Fp8Kernel] = Sm90Fp8Kernel::new [
//!         fused("sm90_fp8_blockscaled_fused_gemm", Tile::M128, E4M3, E4M3, Fused),
//!     ];
//! }
//! ```
//!
//! A row's constant exists at compile time only: an entry point's code is what it would be if
//! written out by hand.

/// A type that a value of a kernel table names: a row holds values (an element type, a scale
/// format), a kernel type takes types, and a family maps one to the other by implementing this
/// for a marker type with the value as a constant parameter (as `ptx::wgmma::Fp8` does for the
/// FP8 pairs).
pub trait Named {
    type T;
}

/// The type that the marker `N` names ([`Named`]).
pub type Of<N> = <N as Named>::T;

/// See the [module](self) documentation.
macro_rules! kernel_table {
    (
        $(#[doc = $doc:literal])*
        #[cfg($cfg:meta)]
        unsafe extern "ptx-kernel" fn |$k:ident| {
            $(gemm($gp:ty) => $gemm:ty;)?
            $(bare($bp:ty) => $bare:ty;)?
            $(call($cp:ty) => $call:path;)?
        }
        $(
            $(#[$list_doc:meta])*
            $vis:vis const $list:ident: &[$row:ty] = $ctor:path [
                $($form:ident $line:tt),* $(,)?
            ];
        )+
    ) => {
        $(
            $(#[$list_doc])*
            $vis const $list: &[$row] = &[$($ctor $line),*];
        )+
        $crate::entry::kernel_table!(@entries
            [$($doc)*] [$($gp => $gemm)?] [$($bp => $bare)?] [$($cp => $call)?] $k, $cfg,
            $([$row, $ctor, $($form $line)*])+
        );
    };
    // Each row's entry point (the templates passed on as single token trees).
    (@entries $doc:tt $gemm:tt $bare:tt $call:tt $k:ident, $cfg:meta,
     $([$row:ty, $ctor:path, $($form:ident $line:tt)*])+) => {
        #[cfg($cfg)]
        const _: () = {
            $($(
                $crate::entry::kernel_table!(
                    @entry $form $line $doc $gemm $bare $call $k: $row = $ctor
                );
            )*)+
        };
    };
    (@entry plain $line:tt $doc:tt [$param:ty => $gemm:ty] $bare:tt $call:tt
     $k:ident: $row:ty = $ctor:path) => {
        $crate::entry::kernel_table!(@gemm $line $doc $k: $row = $ctor, [!$k.fused()],
            p: $param => { p, epi: $crate::params::EpilogueParams::plain(), }, $gemm);
    };
    (@entry fused $line:tt $doc:tt [$param:ty => $gemm:ty] $bare:tt $call:tt
     $k:ident: $row:ty = $ctor:path) => {
        $crate::entry::kernel_table!(@gemm $line $doc $k: $row = $ctor, [$k.fused()],
            q: $crate::params::FusedParams<$param> => { p: q.p, epi: q.epi, }, $gemm);
    };
    (@entry bare $line:tt $doc:tt $gemm:tt [$param:ty => $bare:ty] $call:tt
     $k:ident: $row:ty = $ctor:path) => {
        $crate::entry::kernel_table!(@gemm $line $doc $k: $row = $ctor, [],
            p: $param => { p, }, $bare);
    };
    (@entry call ($name:literal $($rest:tt)*) [$($doc:literal)*] $gemm:tt $bare:tt
     [$param:ty => $call:path] $k:ident: $row:ty = $ctor:path) => {
        const _: () = {
            // (A function that takes no constant of the row leaves it unused.)
            #[allow(dead_code)]
            const $k: $row = $ctor($name $($rest)*);
            $(#[doc = $doc])*
            #[unsafe(export_name = $name)]
            unsafe extern "ptx-kernel" fn kernel(p: $param) {
                // SAFETY: the launch's contract.
                unsafe { $call(&p) }
            }
        };
    };
    // A GEMM entry point: the kernel `$gemm` made of the fields `$field…` from `$arg: $param`
    // (the parameter is `Mapped<$param>`: the launch's tensor maps travel with it), run by the
    // driver with the row's register budgets; `$check`: the row's kernel has the epilogue the
    // entry point takes.
    (@gemm ($name:literal $($rest:tt)*) [$($doc:literal)*] $k:ident: $row:ty = $ctor:path,
     [$($check:expr)?], $arg:ident: $param:ty => { $($field:tt)* }, $gemm:ty) => {
        const _: () = {
            const $k: $row = $ctor($name $($rest)*);
            $(assert!(
                $check,
                concat!($name, ": a `plain` row of a fused kernel or a `fused` row of a plain one")
            );)?
            $(#[doc = $doc])*
            #[unsafe(export_name = $name)]
            unsafe extern "ptx-kernel" fn kernel(mapped: $crate::params::Mapped<$param>) {
                let $arg = mapped.p;
                type Gemm = $gemm;
                let gemm = Gemm {
                    $($field)*
                    types: core::marker::PhantomData,
                };
                // SAFETY: the caller's contract.
                unsafe {
                    $crate::gemm::driver::run::<_, { $k.producer_regs() }, { $k.consumer_regs() }>(
                        &gemm,
                    )
                }
            }
        };
    };
}

pub(crate) use kernel_table;
