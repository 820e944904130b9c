//! What every kernel family's configuration type provides beside its fields: the types are
//! `#[non_exhaustive]` (a field added later breaks no caller), so callers make one with `new`
//! and change one field with a `with_*` method.

/// `new` (every field) and a `with_*` method per field for a configuration struct.
macro_rules! config_fields {
    ($t:ident { $($f:ident: $ty:ty => $with:ident),+ $(,)? }) => {
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
