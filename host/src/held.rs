//! How much device memory a value keeps alive: what the crate's accounting of prepared copies
//! and workspaces reads (a leaf every holder of device memory implements).

use std::any::Any;

use cudarc::driver::CudaSlice;

/// Any value that says how much device memory it keeps: what a matrix's prepared copies
/// ([`Prepared`](crate::buffers::Prepared)) and a workspace's slots hold.
pub(crate) trait Held: Any + Send + Sync {
    /// Bytes of device memory the value keeps alive (its own buffers, not the matrix's).
    fn device_bytes(&self) -> usize;
}

impl<T: cudarc::driver::DeviceRepr + Send + Sync + 'static> Held for CudaSlice<T> {
    fn device_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }
}

impl<T: Held> Held for Option<T> {
    fn device_bytes(&self) -> usize {
        self.as_ref().map_or(0, Held::device_bytes)
    }
}

impl<T: Held> Held for Vec<T> {
    fn device_bytes(&self) -> usize {
        self.iter().map(Held::device_bytes).sum()
    }
}

impl<T: Held, const N: usize> Held for [T; N] {
    fn device_bytes(&self) -> usize {
        self.iter().map(Held::device_bytes).sum()
    }
}

impl<T: Held> Held for (T, u32) {
    fn device_bytes(&self) -> usize {
        self.0.device_bytes()
    }
}

impl<T: Held> Held for (u32, T) {
    fn device_bytes(&self) -> usize {
        self.1.device_bytes()
    }
}

/// [`Held`] for a struct: the sum of its fields' device bytes.
macro_rules! held {
    ($t:ty: $($f:ident),+) => {
        impl $crate::held::Held for $t {
            fn device_bytes(&self) -> usize {
                0 $(+ $crate::held::Held::device_bytes(&self.$f))+
            }
        }
    };
}
pub(crate) use held;
