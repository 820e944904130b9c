//! What every kernel family's configuration type provides beside its fields: the types are
//! `#[non_exhaustive]` (a field added later breaks no caller), so callers make one with `new`
//! and change one field with a `with_*` method.

/// `new` (every field) and a `with_*` method per field for a configuration struct.
macro_rules! config_fields {
    ($t:ident { $($f:ident: $ty:ty => $with:ident),+ $(,)? }) => {
        impl $crate::config::Words for $t {
            fn put(&self, out: &mut Vec<u32>) {
                $($crate::config::Words::put(&self.$f, out);)+
            }
            fn take(it: &mut dyn Iterator<Item = u32>) -> Option<Self> {
                Some($t { $($f: <$ty as $crate::config::Words>::take(it)?),+ })
            }
        }
        impl $t {
            /// A configuration of these fields; the launch checks it (`validate`).
            #[allow(clippy::too_many_arguments)]
            pub fn new($($f: $ty),+) -> Self {
                $t { $($f),+ }
            }
            $(
                #[doc = concat!("This configuration with `", stringify!($f), "` replaced.")]
                pub fn $with(self, $f: $ty) -> Self {
                    $t { $f, ..self }
                }
            )+
        }
    };
}
pub(crate) use config_fields;

/// A configuration value as a flat list of `u32` words, in its fields' order: how the tuner's
/// cache writes a plan ([`crate::plan::Plan::to_text`]). Reading checks only the words' count
/// and each one's range (a bool is 0 or 1); whether the configuration can run is
/// `Plan::validate`'s.
pub(crate) trait Words: Sized {
    fn put(&self, out: &mut Vec<u32>);
    fn take(it: &mut dyn Iterator<Item = u32>) -> Option<Self>;
}

impl Words for u32 {
    fn put(&self, out: &mut Vec<u32>) {
        out.push(*self);
    }
    fn take(it: &mut dyn Iterator<Item = u32>) -> Option<Self> {
        it.next()
    }
}

impl Words for bool {
    fn put(&self, out: &mut Vec<u32>) {
        out.push(*self as u32);
    }
    fn take(it: &mut dyn Iterator<Item = u32>) -> Option<Self> {
        match it.next()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
}

/// [`Words`] for a kernel crate's plain struct of `u32` fields.
macro_rules! words_of {
    ($t:ident { $($f:ident),+ }) => {
        impl Words for $t {
            fn put(&self, out: &mut Vec<u32>) {
                $(out.push(self.$f);)+
            }
            fn take(it: &mut dyn Iterator<Item = u32>) -> Option<Self> {
                Some($t { $($f: it.next()?),+ })
            }
        }
    };
}

use blockscaled_kernels::gemm::scheduler::ClusterShape;
use blockscaled_kernels::sm90::Tile;
use blockscaled_kernels::sm90_half::HalfTile;
use blockscaled_kernels::sm90_mx::MxTile;
use blockscaled_kernels::sm90_w4::W4Tile;

words_of!(Tile {
    consumers,
    waves,
    block_n,
    rows
});
words_of!(ClusterShape { m, n });
words_of!(MxTile { block_n });
words_of!(W4Tile { n });
words_of!(HalfTile { waves, block_n });
