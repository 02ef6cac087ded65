//! Weight overlays: one struct per layout as the layer holds it on the device. Fields are
//! private to the crate: a caller builds each through its validating constructor (`new`), which
//! checks the layout's alignment rules and that every buffer holds its shape (checked
//! arithmetic: the numbers may come from a pack's manifest), and reads it through accessors.
//! The `set_*` methods then check the shape against the layer.

use crate::gpu::{GpuError, GpuResult};

/// Whether a buffer of `bytes` holds the product of `dims` (checked: an overflowing product
/// never fits).
pub(crate) fn fits(bytes: u64, dims: &[usize]) -> bool {
    dims.iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .is_some_and(|need| need <= bytes)
}

pub(crate) fn refuse(what: &str, msg: String) -> GpuError {
    GpuError::Shape(format!("{what}: {msg}"))
}

/// Public read accessors for the crate-private fields of a weight struct.
macro_rules! accessors {
    ($t:ty { $($f:ident: $ft:ty),* $(,)? }) => {
        impl $t {
            $(
                #[doc = concat!("`", stringify!($f), "`.")]
                pub fn $f(&self) -> $ft {
                    self.$f
                }
            )*
        }
    };
}

/// A projection's weight in one layout: its accessors, a validating constructor `new` (the
/// fields in declaration order, checked by the type's `validate`), and [`ProjWeight`].
macro_rules! projection_weight {
    ($t:ident, $new_doc:literal { $($f:ident: $ft:ty),* $(,)? }) => {
        $crate::ffn::weights::accessors!($t { $($f: $ft),* });
        impl $t {
            #[doc = $new_doc]
            pub fn new($($f: $ft),*) -> $crate::gpu::GpuResult<Self> {
                let w = $t { $($f),* };
                w.validate(stringify!($t))?;
                Ok(w)
            }
        }
        impl $crate::ffn::weights::ProjWeight for $t {
            fn shape(&self) -> (usize, usize) {
                (self.n, self.k)
            }
            fn validate(&self, what: &str) -> $crate::gpu::GpuResult<()> {
                $t::validate(self, what)
            }
        }
    };
}

/// A weight that one projection (gate, up or down) of the layer holds: its logical `[n, k]`
/// and its layout's rules, which the `set_*` methods check.
pub(crate) trait ProjWeight {
    /// The logical `(n, k)`.
    fn shape(&self) -> (usize, usize);
    /// The layout's rules; `what` names the caller in errors.
    fn validate(&self, what: &str) -> GpuResult<()>;
}

/// The `n`, `k` and `kp` arguments of a projection kernel, from a weight's shape.
macro_rules! shape_args {
    ($($t:ty),*) => {$(
        impl $t {
            pub(crate) fn dims(&self, c: crate::gpu::table::Call) -> crate::gpu::table::Call {
                c.dim("n", self.n).dim("k", self.k).dim("kp", self.kp)
            }
        }
    )*};
}

pub(crate) use {accessors, projection_weight, shape_args};
