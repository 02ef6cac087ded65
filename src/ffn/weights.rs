//! Weight overlays: one struct per layout as the layer holds it on the device. Fields are
//! private to the crate: a caller builds each through its validating constructor (`new`), which
//! checks the layout's alignment rules and that every buffer holds its shape (checked
//! arithmetic: the numbers may come from a pack's manifest), and reads it through accessors.
//! The `set_*` methods then check the shape against the layer.

use super::*;

use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuError, GpuResult};

/// Whether a buffer of `bytes` holds the product of `dims` (checked: an overflowing product
/// never fits).
pub(crate) fn fits(bytes: u64, dims: &[usize]) -> bool {
    dims.iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .is_some_and(|need| need <= bytes)
}

fn refuse(what: &str, msg: String) -> GpuError {
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
        accessors!($t { $($f: $ft),* });
        impl $t {
            #[doc = $new_doc]
            pub fn new($($f: $ft),*) -> GpuResult<Self> {
                let w = $t { $($f),* };
                w.validate(stringify!($t))?;
                Ok(w)
            }
        }
        impl ProjWeight for $t {
            fn shape(&self) -> (usize, usize) {
                (self.n, self.k)
            }
            fn validate(&self, what: &str) -> GpuResult<()> {
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

/// Block-scaled FP8 weight (`fp8` layout): E4M3 `[np, kp]`, f32 scales `[np/128, kp/128]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Weight {
    pub(crate) weight: DevicePtr,
    pub(crate) scale: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) np: usize,
    pub(crate) kp: usize,
}
projection_weight!(Fp8Weight, "A validated FP8 weight of `[n, k]` stored as `[np, kp]`." {
    weight: DevicePtr,
    scale: DevicePtr,
    n: usize,
    k: usize,
    np: usize,
    kp: usize
});

impl Fp8Weight {
    /// The `fp8` layout's rules: k % 16, np and kp % 128, buffers that hold `[np, kp]` codes and
    /// `[np/128, kp/128]` f32 scales.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        if !w.k.is_multiple_of(16)
            || !w.kp.is_multiple_of(128)
            || !w.np.is_multiple_of(128)
            || w.kp < w.k
            || w.np < w.n
        {
            return Err(refuse(
                what,
                format!(
                    "n {} / np {} / k {} / kp {} do not fit the fp8 layout (k % 16, np and kp % 128)",
                    w.n, w.np, w.k, w.kp
                ),
            ));
        }
        if !fits(w.weight.bytes, &[w.np, w.kp])
            || !fits(w.scale.bytes, &[w.np / 128, w.kp / 128, 4])
        {
            return Err(refuse(
                what,
                format!("buffers too small for [{}, {}]", w.np, w.kp),
            ));
        }
        Ok(())
    }

    /// A view of rows `[row0, row0 + n)` of a fused weight (row0 a multiple of 128).
    pub fn rows(&self, row0: usize, n: usize) -> Fp8Weight {
        assert!(row0.is_multiple_of(128));
        let np = round_up(n, 128);
        Fp8Weight {
            weight: self
                .weight
                .view((row0 * self.kp) as u64, (np * self.kp) as u64),
            scale: self.scale.view(
                (row0 / 128 * self.kp / 128 * 4) as u64,
                (np / 128 * self.kp / 128 * 4) as u64,
            ),
            n,
            k: self.k,
            np,
            kp: self.kp,
        }
    }
}

/// BF16 weight (`bf16` layout): `[n, kp]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bf16Weight {
    pub(crate) weight: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(Bf16Weight, "A validated BF16 weight of `[n, k]` stored as `[n, kp]`." {
    weight: DevicePtr,
    n: usize,
    k: usize,
    kp: usize
});

impl Bf16Weight {
    /// The `bf16` layout's rules: k and kp % 8, a buffer that holds `[n, kp]`.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        if !w.k.is_multiple_of(8)
            || w.kp < w.k
            || !w.kp.is_multiple_of(8)
            || !fits(w.weight.bytes, &[w.n, w.kp, 2])
        {
            return Err(refuse(
                what,
                format!(
                    "k {} / kp {} / {} bytes do not fit the bf16 layout",
                    w.k, w.kp, w.weight.bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Per-row FP8 weight (`w8a8` layout): E4M3 `[n, kp]`, f32 row scales `[n]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct W8a8Weight {
    pub(crate) weight: DevicePtr,
    pub(crate) scale: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(W8a8Weight, "A validated W8A8 weight of `[n, k]` stored as `[n, kp]`." {
    weight: DevicePtr,
    scale: DevicePtr,
    n: usize,
    k: usize,
    kp: usize
});

impl W8a8Weight {
    /// The `w8a8` layout's rules: kp % 128 (its `K_ALIGN`), buffers that hold `[n, kp]` and
    /// `[n]` f32.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let x = self;
        if !x
            .kp
            .is_multiple_of(crate::converters::layouts::w8a8::K_ALIGN)
            || x.kp < x.k
            || !fits(x.weight.bytes, &[x.n, x.kp])
            || !fits(x.scale.bytes, &[x.n, 4])
        {
            return Err(refuse(
                what,
                format!("kp {} / buffers do not fit the w8a8 layout", x.kp),
            ));
        }
        Ok(())
    }
}

/// The NVFP4 base (`nvfp4` layout) of one projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvfp4Weight {
    pub(crate) codes: DevicePtr,
    pub(crate) scales: DevicePtr,
    pub(crate) global_scale: f32,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(Nvfp4Weight, "A validated NVFP4 weight of `[n, k]` stored as `[n, kp]` (codes `[n, kp/2]`, E4M3 block scales `[n, kp/16]`)." {
    codes: DevicePtr,
    scales: DevicePtr,
    global_scale: f32,
    n: usize,
    k: usize,
    kp: usize,
});

impl Nvfp4Weight {
    /// The `nvfp4` layout's rules: k % 32, kp % 64, buffers that hold its codes and scales.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let x = self;
        if !x.k.is_multiple_of(32)
            || !x.kp.is_multiple_of(64)
            || x.kp < x.k
            || !fits(x.codes.bytes, &[x.n, x.kp / 2])
            || !fits(x.scales.bytes, &[x.n, x.kp / 16])
        {
            return Err(refuse(
                what,
                format!(
                    "k {} / kp {} / buffers do not fit the nvfp4 layout (k % 32, kp % 64)",
                    x.k, x.kp
                ),
            ));
        }
        Ok(())
    }
}

/// The transposed NVFP4 copy (`nvfp4_t` layout) of one projection: codes `[kp, np/2]`,
/// scales `[kp/16, np]`, np = n rounded up to 64. `owned`: the layer allocated it (and frees it
/// in `finalize_nvfp4_mmq_load`); a view into a loaded pack is only dropped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvfp4TWeight {
    pub(crate) codes: DevicePtr,
    pub(crate) scales: DevicePtr,
    pub(crate) np: usize,
    pub(crate) owned: bool,
}
accessors!(Nvfp4TWeight {
    codes: DevicePtr,
    scales: DevicePtr,
    np: usize,
    owned: bool
});

impl Nvfp4TWeight {
    /// A view of a given `_t` copy (not owned by the layer); validated against its base when
    /// installed (`set_nvfp4_t_weights`).
    pub fn new(codes: DevicePtr, scales: DevicePtr, np: usize) -> Self {
        Nvfp4TWeight {
            codes,
            scales,
            np,
            owned: false,
        }
    }

    /// The `nvfp4_t` layout's rules against the base `base`: np = n rounded up to 64, buffers
    /// that hold `[kp, np/2]` codes and `[kp/16, np]` scales.
    pub(crate) fn validate(&self, base: &Nvfp4Weight, what: &str) -> GpuResult<()> {
        let x = self;
        if x.np != base.n.div_ceil(64) * 64
            || !fits(x.codes.bytes, &[base.kp, x.np / 2])
            || !fits(x.scales.bytes, &[base.kp / 16, x.np])
        {
            return Err(refuse(
                what,
                format!(
                    "np {} / buffers do not fit the nvfp4_t layout of [{}, {}]",
                    x.np, base.n, base.kp
                ),
            ));
        }
        Ok(())
    }
}

/// A LoRA adapter of one projection (`lora` layout): A BF16 `[rank, k]`, B BF16 `[n, rank]`;
/// the projection's output gains `scaling * B (A x)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraWeight {
    pub(crate) a: DevicePtr,
    pub(crate) b: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) rank: usize,
    pub(crate) scaling: f32,
}
projection_weight!(LoraWeight, "A validated adapter: rank 1..=[`LORA_MAX_RANK`], buffers that hold A and B in BF16." {
    a: DevicePtr,
    b: DevicePtr,
    n: usize,
    k: usize,
    rank: usize,
    scaling: f32
});

impl LoraWeight {
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let x = self;
        if x.rank == 0
            || x.rank > LORA_MAX_RANK
            || !fits(x.a.bytes, &[2, x.rank, x.k])
            || !fits(x.b.bytes, &[2, x.n, x.rank])
        {
            return Err(refuse(
                what,
                format!(
                    "rank {} (1..={LORA_MAX_RANK}) or buffers do not fit A [rank, {}] and B [{}, rank] in BF16",
                    x.rank, x.k, x.n
                ),
            ));
        }
        Ok(())
    }
}

/// Packed q2g128 weight (`q2g128` layout): `[n, kp/128]` blocks of [`Q2G128_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q2g128Weight {
    pub(crate) blocks: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
}
projection_weight!(Q2g128Weight, "A validated q2g128 weight of `[n, k]` stored as `[n, kp]`." {
    blocks: DevicePtr,
    n: usize,
    k: usize,
    kp: usize
});

impl Q2g128Weight {
    /// The `q2g128` layout's rules: kp % 128, a buffer that holds `[n, kp/128]` blocks.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        if !w.kp.is_multiple_of(Q2G128_ELEMS)
            || w.kp < w.k
            || !fits(w.blocks.bytes, &[w.n, w.kp / Q2G128_ELEMS, Q2G128_BYTES])
        {
            return Err(refuse(
                what,
                format!(
                    "kp {} / {} bytes do not fit the q2g128 layout of [{}, {}] (kp % {Q2G128_ELEMS}, {Q2G128_BYTES} bytes per {Q2G128_ELEMS})",
                    w.kp, w.blocks.bytes, w.n, w.k
                ),
            ));
        }
        Ok(())
    }
}

pub use crate::converters::layouts::lora::LORA_MAX_RANK;

/// The down projection of the Q4_K MMQ arm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Q4kDown {
    /// Int8 codes `[hidden, kp_down]` with f32 row scales `[hidden]` (the default).
    Int8 {
        /// The int8 codes.
        codes: DevicePtr,
        /// The f32 row scales.
        scales: DevicePtr,
    },
    /// Q4_K rows like gate and up (`METRALE_Q4K_MMQ_DOWN_Q4K`).
    Q4k(DevicePtr),
}

/// The Q4_K MMQ arm's weights (`q4k_mmq` layout) of a `hidden` x `inter` layer: gate and up as
/// Q4_K rows (K padded to 256), down as int8 rows or Q4_K. `owned`: built by
/// `finalize_q4k_load` (else views into a pack).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q4kMmqWeights {
    pub(crate) gate: DevicePtr,
    pub(crate) up: DevicePtr,
    pub(crate) down: Q4kDown,
    pub(crate) hidden: usize,
    pub(crate) inter: usize,
    /// K of gate/up (hidden) and of down (inter), rounded up to 256.
    pub(crate) kp_gate: usize,
    pub(crate) kp_down: usize,
    pub(crate) owned: bool,
}
accessors!(Q4kMmqWeights {
    gate: DevicePtr,
    up: DevicePtr,
    down: Q4kDown,
    hidden: usize,
    inter: usize,
    kp_gate: usize,
    kp_down: usize,
    owned: bool,
});

impl Q4kMmqWeights {
    /// Validated views of given `q4k_mmq` copies of a `hidden` x `inter` layer (not owned by
    /// the layer).
    pub fn new(
        gate: DevicePtr,
        up: DevicePtr,
        down: Q4kDown,
        (hidden, inter): (usize, usize),
        (kp_gate, kp_down): (usize, usize),
    ) -> GpuResult<Self> {
        let q = Q4kMmqWeights {
            gate,
            up,
            down,
            hidden,
            inter,
            kp_gate,
            kp_down,
            owned: false,
        };
        q.validate("Q4kMmqWeights")?;
        Ok(q)
    }

    /// The `q4k_mmq` layout's rules: kp % 256 and at least the k, buffers that hold the rows.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let (h, i, q) = (self.hidden, self.inter, self);
        let rows = |n: usize, kp: usize| [n, kp / Q4K_ELEMS, Q4K_BYTES];
        let ok = q.kp_gate.is_multiple_of(Q4K_ELEMS)
            && q.kp_down.is_multiple_of(Q4K_ELEMS)
            && q.kp_gate >= h
            && q.kp_down >= i
            && fits(q.gate.bytes, &rows(i, q.kp_gate))
            && fits(q.up.bytes, &rows(i, q.kp_gate))
            && match q.down {
                Q4kDown::Int8 { codes, scales } => {
                    fits(codes.bytes, &[h, q.kp_down]) && fits(scales.bytes, &[h, 4])
                }
                Q4kDown::Q4k(d) => fits(d.bytes, &rows(h, q.kp_down)),
            };
        if !ok {
            return Err(refuse(
                what,
                format!(
                    "kp {} / {} or buffers do not fit the q4k_mmq layout of a {h} x {i} layer",
                    q.kp_gate, q.kp_down
                ),
            ));
        }
        Ok(())
    }
}

/// The FP8 overlay: gate, up, down and, optionally, the fused gate+up they view.
#[derive(Clone, Debug)]
pub struct Fp8Overlay {
    pub(crate) gate: Fp8Weight,
    pub(crate) up: Fp8Weight,
    pub(crate) down: Fp8Weight,
    pub(crate) fused: Option<Fp8Weight>,
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
shape_args!(Fp8Weight, Bf16Weight, Nvfp4Weight, Q2g128Weight);
