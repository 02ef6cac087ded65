//! The forward context: model dimensions, the scratch arena and the levers.

use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuBackend, GpuError, GpuResult, ModelLevers, StreamId};
use std::sync::Arc;

/// Model dimensions the context is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FfnConfig {
    /// Hidden size.
    pub hidden: usize,
    /// Intermediate size.
    pub inter: usize,
}

/// Scratch buffers shared by the layers of a model.
#[derive(Clone, Debug)]
pub struct Arena {
    /// `[max_tokens, hidden]` f32: every forward method's output.
    pub output: DevicePtr,
    /// `[max_tokens, max(inter, 2*interp/max_tokens..)]` f32: gate projection output (the fused
    /// FP8 gate+up GEMV writes `[1, 2*interp]` here).
    pub gate_out: DevicePtr,
    /// `[max_tokens, inter]` f32: up projection output, and act-mul output of the fused path.
    pub up_out: DevicePtr,
    /// LoRA `A x` and delta (used by the LoRA arm).
    pub lora_xa: DevicePtr,
    /// The LoRA delta of one projection, `[max_tokens, max(hidden, inter)]` f32.
    pub lora_delta: DevicePtr,
    /// q8_1 activation blocks, `[max_tokens, kmax / 32]` (`DenseFfnLayer::quantize_q8_1`: the
    /// arms that multiply int8 activations in llama.cpp's q8_1 blocks).
    pub act_q8_1: DevicePtr,
    /// BF16 scratch of one projection dequantized for a prefill (the arms that dequantize their
    /// weights for the BF16 GEMM).
    pub dequant_bf16: DevicePtr,
    /// FP8 activation codes `[max_tokens, kp_max]` and their row scales `[max_tokens]` (W8A8).
    pub act_codes: DevicePtr,
    /// Activation scales (f32) of the quantizing arms: per row, or per row and 128-column group;
    /// for int8 codes per 32 columns (in `act_codes`) 4 per group of up to
    /// [`AFFINE_GEMV_MAX_ROWS`] rows.
    pub act_scale: DevicePtr,
    /// BF16 activations `[max_tokens, max(hidden, inter)]` for the cuBLAS arm.
    pub act_bf16: DevicePtr,
    /// A one-row decode's down input quantized inside its gate and up GEMVs (an arm that fuses
    /// the act-mul's quantization into them), one row: codes `[kmax]`, then scales
    /// `[kmax / 32 x 4]` f32,
    /// then the arrival counters `[kmax / 32]` u32 (zero between calls): [`Arena::act_down_parts`].
    pub act_down: DevicePtr,
}

impl Arena {
    /// The codes, scales and counters of [`Arena::act_down`] for a padded k of `kp` (at most
    /// the arena's).
    pub fn act_down_parts(&self, kp: usize) -> (DevicePtr, DevicePtr, DevicePtr) {
        // Per group of 32 values of k: 32 code bytes, 16 of scales, 4 of counter.
        let kmax = self.act_down.bytes as usize / ACT_DOWN_GROUP_BYTES * AFFINE_GROUP;
        let (codes, scales) = (kmax as u64, (kmax / AFFINE_GROUP * 16) as u64);
        (
            self.act_down.view(0, kp as u64),
            self.act_down.view(codes, (kp / AFFINE_GROUP * 16) as u64),
            self.act_down
                .view(codes + scales, (kp / AFFINE_GROUP * 4) as u64),
        )
    }

    /// Every buffer of the arena.
    pub fn all(&self) -> [DevicePtr; 11] {
        [
            self.output,
            self.gate_out,
            self.up_out,
            self.lora_xa,
            self.lora_delta,
            self.act_q8_1,
            self.dequant_bf16,
            self.act_codes,
            self.act_scale,
            self.act_bf16,
            self.act_down,
        ]
    }
}

/// Bytes of [`Arena::act_down`] per group of 32 values of k: the codes, the scales (4 f32), the
/// counter (u32).
const ACT_DOWN_GROUP_BYTES: usize = AFFINE_GROUP + 16 + 4;

/// What a forward call needs besides the layer: backend, dimensions, scratch, levers.
pub struct ForwardContext {
    /// The runtime.
    pub backend: Arc<dyn GpuBackend>,
    /// The layer shape the arena is sized for.
    pub config: FfnConfig,
    /// Scratch buffers.
    pub arena: Arena,
    /// Routing levers.
    pub levers: ModelLevers,
    /// Synchronize around prefill and log `FFN prefill [dense_total] N=<n>: <us>µs`.
    pub profile: bool,
    /// The most rows one call may pass.
    pub max_tokens: usize,
    /// The stream every launch goes to.
    pub stream: StreamId,
    /// Record the names of the kernels launched in `trace` (off by default: an engine that
    /// runs forever must not keep a growing list; the checks and tests turn it on).
    pub tracing: bool,
    /// Names of the kernels launched while `tracing`, in order (cleared by the caller).
    pub trace: Vec<&'static str>,
}

impl Drop for ForwardContext {
    /// The scratch arena goes back to the backend with the context.
    fn drop(&mut self) {
        for p in self.arena.all() {
            self.backend.free(p);
        }
    }
}

pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

/// The most rows one forward call may pass, and so the largest `max_rows` (`max_tokens`) a
/// context is sized for: 65536, past any engine's prefill chunk (vLLM's default batch is 8192
/// tokens, llama.cpp's `n_batch` 2048). A larger number is refused before anything is
/// allocated, not left to fail an allocation (or to wrap a size).
pub const MAX_FORWARD_ROWS: usize = 1 << 16;

/// The arena's buffer sizes in bytes, in [`Arena`] field order, for `t` rows; `None` when one
/// overflows (numbers from a caller and a pack's manifest).
fn arena_sizes(config: FfnConfig, t: u64) -> Option<[u64; 11]> {
    let (h, i) = (config.hidden as u64, config.inter as u64);
    let r = |x: usize, m: u64| (x as u64).checked_next_multiple_of(m);
    let interp = r(config.inter, 128)?;
    // 256: the Q4_K MMQ arm's K padding (the largest of the layouts').
    let kmax = r(config.hidden.max(config.inter), 256)?;
    let hi = h.max(i);
    let mul = |a: u64, b: u64| a.checked_mul(b);
    Some([
        mul(mul(t, h)?, 4)?,
        mul(mul(t, i)?.max(mul(2, interp)?), 4)?,
        mul(mul(t, i)?, 4)?,
        mul(t, 256 * 4)?,
        mul(mul(t, hi)?, 4)?,
        mul(mul(t, kmax / Q8_1_ELEMS as u64)?, Q8_1_BYTES as u64)?,
        // One projection dequantized to BF16 `[n, kp]` (kp = k rounded up to 128).
        mul(
            2,
            mul(i, r(config.hidden, 128)?)?.max(mul(h, r(config.inter, 128)?)?),
        )?,
        mul(t, kmax)?,
        // Per row (W8A8) or per 128-column group (the FP8 arm's W8A8 prefill).
        mul(mul(t, kmax / 128)?, 4)?.max(mul(
            t.min(AFFINE_GEMV_MAX_ROWS as u64),
            mul(kmax / 32, 16)?,
        )?),
        mul(mul(t, hi)?, 2)?,
        mul(kmax / AFFINE_GROUP as u64, ACT_DOWN_GROUP_BYTES as u64)?,
    ])
}

impl ForwardContext {
    /// Note a kernel launch in the trace, when tracing.
    pub(crate) fn record(&mut self, name: &'static str) {
        if self.tracing {
            self.trace.push(name);
        }
    }

    /// Allocate the arena for up to `max_tokens` rows (at most [`MAX_FORWARD_ROWS`]). Every
    /// size is computed with checked arithmetic; a size that overflows, or an allocation the
    /// backend refuses, is an error (what was allocated before it is freed).
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        config: FfnConfig,
        max_tokens: usize,
        levers: ModelLevers,
    ) -> GpuResult<Self> {
        let t = max_tokens.max(1);
        if t > MAX_FORWARD_ROWS {
            return Err(GpuError::Shape(format!(
                "max_rows {max_tokens}: a forward takes at most {MAX_FORWARD_ROWS} rows"
            )));
        }
        let sizes = arena_sizes(config, t as u64).ok_or_else(|| {
            GpuError::Shape(format!(
                "max_rows {t} with hidden {} and intermediate {}: the scratch arena's size overflows",
                config.hidden, config.inter
            ))
        })?;
        let b = &backend;
        let mut got: Vec<DevicePtr> = Vec::with_capacity(sizes.len());
        for bytes in sizes {
            match b.alloc(bytes) {
                Ok(p) => got.push(p),
                Err(e) => {
                    got.into_iter().for_each(|p| b.free(p));
                    return Err(e);
                }
            }
        }
        // In `Arena::all`'s order, as `arena_sizes` gives them.
        let mut got = got.into_iter();
        let mut next = || got.next().expect("one allocation per size");
        let arena = Arena {
            output: next(),
            gate_out: next(),
            up_out: next(),
            lora_xa: next(),
            lora_delta: next(),
            act_q8_1: next(),
            dequant_bf16: next(),
            act_codes: next(),
            act_scale: next(),
            act_bf16: next(),
            act_down: next(),
        };
        // Zeroed once, so that no read of the arena ever sees bytes nothing wrote: cuBLAS's
        // Hopper GEMMs store their output with the bulk tensor copy, which compute-sanitizer's
        // initcheck does not count as a write, so every `act_mul` read of a cuBLAS output was
        // reported as uninitialized (#13). One memset per context, not per forward.
        for p in arena.all() {
            b.fill(p, 0)?;
        }
        Ok(ForwardContext {
            backend,
            config,
            arena,
            levers,
            profile: false,
            max_tokens: t,
            stream: 0,
            tracing: false,
            trace: Vec::new(),
        })
    }
}
