//! Weight overlays: one struct per layout as the layer holds it on the device.

use super::*;

use crate::gpu::{DevicePtr, GpuError, GpuResult};

/// Block-scaled FP8 weight (`fp8` layout): E4M3 `[np, kp]`, f32 scales `[np/128, kp/128]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Weight {
    pub weight: DevicePtr,
    pub scale: DevicePtr,
    pub n: usize,
    pub k: usize,
    pub np: usize,
    pub kp: usize,
}

impl Fp8Weight {
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
    pub weight: DevicePtr,
    pub n: usize,
    pub k: usize,
    pub kp: usize,
}

/// Per-row FP8 weight (`w8a8` layout): E4M3 `[n, kp]`, f32 row scales `[n]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct W8a8Weight {
    pub weight: DevicePtr,
    pub scale: DevicePtr,
    pub n: usize,
    pub k: usize,
    pub kp: usize,
}

/// The NVFP4 base (`nvfp4` layout) of one projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvfp4Weight {
    pub codes: DevicePtr,
    pub scales: DevicePtr,
    pub global_scale: f32,
    pub n: usize,
    pub k: usize,
    pub kp: usize,
}

/// The transposed NVFP4 copy (`nvfp4_t` layout) of one projection: codes `[kp, np/2]`,
/// scales `[kp/16, np]`, np = n rounded up to 64. `owned`: the layer allocated it (and frees it
/// in `finalize_nvfp4_mmq_load`); a view into a loaded pack is only dropped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nvfp4TWeight {
    pub codes: DevicePtr,
    pub scales: DevicePtr,
    pub np: usize,
    pub owned: bool,
}

/// A LoRA adapter of one projection (`lora` layout): A BF16 `[rank, k]`, B BF16 `[n, rank]`;
/// the projection's output gains `scaling * B (A x)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraWeight {
    pub a: DevicePtr,
    pub b: DevicePtr,
    pub n: usize,
    pub k: usize,
    pub rank: usize,
    pub scaling: f32,
}

/// Packed q2g128 weight (`q2g128` layout): `[n, kp/128]` blocks of 34 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q2g128Weight {
    pub blocks: DevicePtr,
    pub n: usize,
    pub k: usize,
    pub kp: usize,
}

/// The largest adapter rank the arena's `lora_xa` scratch holds.
pub const LORA_MAX_RANK: usize = 256;

/// The layer's base weights: NVFP4, possibly absent, with its load-time copies: the transposed
/// `_t` copies the `w4a16_gemm_t*` prefill reads, and the `nvfp4_mmq` tiles of the MMQ prefill
/// (built by `finalize_nvfp4_mmq_load`, which frees the `_t` copy of what it repacks, or given
/// by a pack).
#[derive(Clone, Debug, Default)]
pub struct DenseFfnWeights {
    pub nvfp4: Option<[Nvfp4Weight; 3]>,
    pub nvfp4_t: [Option<Nvfp4TWeight>; 3],
    pub nvfp4_mmq: [Option<DevicePtr>; 3],
    /// The Q4_K MMQ copies (`q4k_mmq` layout), built by `finalize_q4k_load` or given by a pack.
    pub q4k: Option<Q4kMmqWeights>,
}

/// The down projection of the Q4_K MMQ arm.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Q4kDown {
    /// Int8 codes `[hidden, kp_down]` with f32 row scales `[hidden]` (the default).
    Int8 { codes: DevicePtr, scales: DevicePtr },
    /// Q4_K rows like gate and up (`METRALE_Q4K_MMQ_DOWN_Q4K`).
    Q4k(DevicePtr),
}

/// The Q4_K MMQ arm's weights (`q4k_mmq` layout): gate and up as Q4_K rows (K padded to 256),
/// down as int8 rows or Q4_K. `owned`: built by `finalize_q4k_load` (else views into a pack).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q4kMmqWeights {
    pub gate: DevicePtr,
    pub up: DevicePtr,
    pub down: Q4kDown,
    /// K of gate/up (hidden) and of down (inter), rounded up to 256.
    pub kp_gate: usize,
    pub kp_down: usize,
    pub owned: bool,
}

/// The FP8 overlay: gate, up, down and, optionally, the fused gate+up they view.
#[derive(Clone, Debug)]
pub struct Fp8Overlay {
    pub gate: Fp8Weight,
    pub up: Fp8Weight,
    pub down: Fp8Weight,
    pub fused: Option<Fp8Weight>,
}

pub(crate) fn check_fp8(w: &Fp8Weight, what: &str) -> GpuResult<()> {
    if !w.k.is_multiple_of(16)
        || !w.kp.is_multiple_of(128)
        || !w.np.is_multiple_of(128)
        || w.kp < w.k
        || w.np < w.n
    {
        return Err(GpuError::Invalid(format!(
            "{what}: n {} / np {} / k {} / kp {} do not fit the fp8 layout (k % 16, np and kp % 128)",
            w.n, w.np, w.k, w.kp
        )));
    }
    if !fits(w.weight.bytes, &[w.np, w.kp]) || !fits(w.scale.bytes, &[w.np / 128, w.kp / 128, 4]) {
        return Err(GpuError::Invalid(format!(
            "{what}: buffers too small for [{}, {}]",
            w.np, w.kp
        )));
    }
    Ok(())
}

/// Whether a buffer of `bytes` holds the product of `dims` (checked: the numbers may come from a
/// pack's manifest, and an overflowing product never fits).
pub(crate) fn fits(bytes: u64, dims: &[usize]) -> bool {
    dims.iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
        .is_some_and(|need| need <= bytes)
}
