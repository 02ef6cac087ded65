//! `DenseFfnLayer`: the engine's dense FFN layer with its weight overlays and forward arms, on
//! any [`GpuBackend`]. This file holds the contract (methods, routing) and the BF16, FP8, W8A8
//! and NVFP4 arms (W4A16 decode GEMVs, the batch-m tiers, the `_t`, MMQ and base prefill GEMMs,
//! W4A4 and the fixed W4A4 path); the Q4_K-MMQ, packed-Q2 and LoRA arms resolve their kernels by
//! name and return [`GpuError::MissingKernel`] naming the kernel until those kernels exist.
//!
//! Activations are f32 row-major `[m, hidden]`; outputs land in the arena's `moe_output`
//! (`[m, hidden]` f32). Every kernel launched is appended to `ForwardContext::trace`, so tests
//! can assert which arm served a call.

use crate::gpu::{
    DevicePtr, GemmBf16, GpuBackend, GpuError, GpuResult, KArg, KernelHandle, LaunchCfg,
    ModelLevers, StreamId,
};
use crate::model::Activation;
use std::sync::Arc;

/// Model dimensions the context is sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FfnConfig {
    pub hidden: usize,
    pub inter: usize,
}

/// Scratch buffers shared by the layers of a model.
#[derive(Clone, Debug)]
pub struct Arena {
    /// `[max_tokens, hidden]` f32: every forward method's output.
    pub moe_output: DevicePtr,
    /// `[max_tokens, max(inter, 2*interp/max_tokens..)]` f32: gate projection output (the fused
    /// FP8 gate+up GEMV writes `[1, 2*interp]` here).
    pub expert_gate_out: DevicePtr,
    /// `[max_tokens, inter]` f32: up projection output, and act-mul output of the fused path.
    pub expert_up_out: DevicePtr,
    /// LoRA `A x` and delta (used by the LoRA arm).
    pub lora_xa: DevicePtr,
    pub lora_delta: DevicePtr,
    /// Packed-Q2 activation quantization and dequantization scratch (Q2 arm).
    pub q2_act_q8: DevicePtr,
    pub q2_dequant_scratch: DevicePtr,
    /// FP8 activation codes `[max_tokens, kp_max]` and their row scales `[max_tokens]` (W8A8).
    pub act_fp8: DevicePtr,
    pub act_scale: DevicePtr,
    /// BF16 activations `[max_tokens, max(hidden, inter)]` for the cuBLAS arm.
    pub act_bf16: DevicePtr,
}

impl Arena {
    /// Every buffer of the arena.
    pub fn all(&self) -> [DevicePtr; 10] {
        [
            self.moe_output,
            self.expert_gate_out,
            self.expert_up_out,
            self.lora_xa,
            self.lora_delta,
            self.q2_act_q8,
            self.q2_dequant_scratch,
            self.act_fp8,
            self.act_scale,
            self.act_bf16,
        ]
    }
}

/// What a forward call needs besides the layer: backend, dimensions, scratch, levers.
pub struct ForwardContext {
    pub backend: Arc<dyn GpuBackend>,
    pub config: FfnConfig,
    pub arena: Arena,
    pub levers: ModelLevers,
    /// Synchronize around prefill and log `FFN prefill [dense_total] N=<n>: <us>µs`.
    pub profile: bool,
    pub max_tokens: usize,
    pub stream: StreamId,
    /// Names of the kernels launched, in order (cleared by the caller when it likes).
    pub trace: Vec<&'static str>,
}

fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}

impl ForwardContext {
    /// Allocate the arena for up to `max_tokens` rows.
    pub fn new(
        backend: Arc<dyn GpuBackend>,
        config: FfnConfig,
        max_tokens: usize,
        levers: ModelLevers,
    ) -> GpuResult<Self> {
        let (h, i, t) = (
            config.hidden as u64,
            config.inter as u64,
            max_tokens.max(1) as u64,
        );
        let interp = round_up(config.inter, 128) as u64;
        // 256: the Q4_K MMQ arm's K padding (the largest of the layouts').
        let kmax = round_up(config.hidden.max(config.inter), 256) as u64;
        let b = &backend;
        let arena = Arena {
            moe_output: b.alloc(t * h * 4)?,
            expert_gate_out: b.alloc((t * i).max(2 * interp) * 4)?,
            expert_up_out: b.alloc(t * i * 4)?,
            lora_xa: b.alloc(t * 256 * 4)?,
            lora_delta: b.alloc(t * h.max(i) * 4)?,
            q2_act_q8: b.alloc(t * kmax / 32 * 36)?,
            // One projection dequantized to BF16 `[n, kp]` (kp = k rounded up to 128).
            q2_dequant_scratch: b.alloc(
                2 * (i * round_up(config.hidden, 128) as u64)
                    .max(h * round_up(config.inter, 128) as u64),
            )?,
            act_fp8: b.alloc(t * kmax)?,
            act_scale: b.alloc(t * 4)?,
            act_bf16: b.alloc(t * h.max(i) * 2)?,
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
            max_tokens: max_tokens.max(1),
            stream: 0,
            trace: Vec::new(),
        })
    }
}

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

/// Packed Q2_0-g128 weight (`q2g128` layout): `[n, kp/128]` blocks of 34 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q2Weight {
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
    /// Q4_K rows like gate and up (`METRALE_FFN_MMQ_DOWN_Q4K`).
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

macro_rules! kernel_set {
    ($($field:ident = $module:literal :: $name:literal;)*) => {
        /// Every kernel the layer may launch, resolved once at construction (0 = missing).
        #[derive(Clone, Copy, Debug, Default)]
        pub struct FfnKernels { $(pub $field: KernelHandle,)* }
        impl FfnKernels {
            pub fn resolve(b: &dyn GpuBackend) -> Self {
                FfnKernels { $($field: b.kernel($module, $name),)* }
            }
        }
        /// `(field, module, name)` of every kernel, for messages and tests.
        pub const FFN_KERNELS: &[(&str, &str, &str)] = &[$((stringify!($field), $module, $name),)*];
        /// The kernel name of a resolved handle (for the trace).
        fn name_of(h: KernelHandle, k: &FfnKernels) -> &'static str {
            $(if h.ok() && h == k.$field { return $name; })*
            "?"
        }
    };
}

kernel_set! {
    act_silu = "ffn_act"::"act_mul_silu";
    act_gelu = "ffn_act"::"act_mul_gelu";
    to_bf16 = "ffn_act"::"f32_to_bf16";
    fp8_b4 = "ffn_fp8"::"w8a16_gemv_batch4";
    fp8_b16 = "ffn_fp8"::"w8a16_gemv_batch16";
    fp8_m16 = "ffn_fp8"::"w8a16_gemm_m16";
    fp8_pipe = "ffn_fp8"::"w8a16_gemm_pipelined";
    fp8_base = "ffn_fp8"::"w8a16_gemm";
    fp8_w8a8_block = "ffn_fp8"::"w8a8_block_gemm";
    quant_fp8_row = "ffn_w8a8"::"quantize_act_fp8_row";
    w8a8 = "ffn_w8a8"::"w8a8_gemm";
    bf16_gemv = "ffn_bf16"::"bf16_gemv_batch4";
    nvfp4_gemv_dual = "ffn_nvfp4"::"w4a16_gemv_dual";
    nvfp4_gemv = "ffn_nvfp4"::"w4a16_gemv";
    nvfp4_gemm = "ffn_nvfp4"::"w4a16_gemm";
    nvfp4_gemv_b2 = "ffn_nvfp4"::"w4a16_gemv_batch2";
    nvfp4_gemv_b3 = "ffn_nvfp4"::"w4a16_gemv_batch3";
    nvfp4_gemv_dual_b2 = "ffn_nvfp4"::"w4a16_gemv_dual_batch2";
    nvfp4_gemv_dual_b3 = "ffn_nvfp4"::"w4a16_gemv_dual_batch3";
    nvfp4_silu_down = "ffn_nvfp4"::"w4a16_gemv_silu_down";
    nvfp4_gemv_ksplit = "ffn_nvfp4"::"w4a16_gemv_ksplit";
    nvfp4_gemm_t = "ffn_nvfp4"::"w4a16_gemm_t";
    nvfp4_gemm_t_k64 = "ffn_nvfp4"::"w4a16_gemm_t_k64";
    nvfp4_gemm_t_m128 = "ffn_nvfp4"::"w4a16_gemm_t_m128";
    nvfp4_gemm_t_m128_v2 = "ffn_nvfp4"::"w4a16_gemm_t_m128_v2";
    nvfp4_mmq_gemm = "ffn_nvfp4"::"nvfp4_mmq_gemm";
    quant_nvfp4 = "ffn_nvfp4"::"quantize_act_nvfp4";
    q2_gemv = "ffn_q2"::"q2_0_gemv_vec";
    q2_gemv_m = "ffn_q2"::"q2_0_gemv_vec_batchm";
    q2_dequant = "ffn_q2"::"dequant_q2_0_gn_to_bf16";
    q2_mmq = "ffn_q2"::"q2_0_mmq_gemm";
    quant_q8_1 = "ffn_q8_1"::"quantize_act_q8_1";
    q4k_encode = "ffn_q4k"::"nvfp4_to_q4k";
    q4k_int8_encode = "ffn_q4k"::"nvfp4_to_int8_rows";
    q4k_gemm = "ffn_q4k"::"q4k_mmq_gemm";
    int8_gemm = "ffn_q4k"::"int8_gemm_faith2";
    requant_int8 = "ffn_q4k"::"requant_a_bf16_int8";
    lora_a = "ffn_lora"::"lora_a";
    lora_b = "ffn_lora"::"lora_b_add";
    nvfp4_small_m4 = "ffn_nvfp4"::"nvfp4_proj_small_m4";
    nvfp4_small_m8 = "ffn_nvfp4"::"nvfp4_proj_small_m8";
    nvfp4_small_m16 = "ffn_nvfp4"::"nvfp4_proj_small_m16";
    nvfp4_proj_mx = "ffn_nvfp4"::"nvfp4_proj_mx";
    nvfp4_repack = "ffn_nvfp4"::"nvfp4_mmq_repack";
}

/// A declared activation format that means NVFP4 activations.
fn declared_a4(f: &str) -> bool {
    matches!(f, "w4a4" | "a4" | "nvfp4")
}

fn missing(module: &str, name: &str) -> GpuError {
    GpuError::MissingKernel {
        module: module.into(),
        name: name.into(),
    }
}

/// Which projection of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum P {
    Gate,
    Up,
    Down,
}

/// The engine's dense FFN layer.
pub struct DenseFfnLayer {
    pub hidden: usize,
    pub inter: usize,
    pub activation: Activation,
    pub weights: DenseFfnWeights,
    bf16: Option<[Bf16Weight; 3]>,
    fp8: Option<Fp8Overlay>,
    w8a8: Option<[W8a8Weight; 3]>,
    lora: Option<[Option<LoraWeight>; 3]>,
    q2: Option<[Q2Weight; 3]>,
    kernels: FfnKernels,
}

/// Output columns per block of the NVFP4 GEMVs (`w4a16_gemv*`, the batch-m tiers): 8 warps of
/// `GEMV_R` = 4 columns (kernels/ffn_nvfp4.cu; 2 measured slower on the H200).
pub const NVFP4_GEMV_COLS: usize = 32;

/// Rows the declared W8A8 arm serves in prefill before the next arm (HARDWARE.toml default).
pub const W8A8_MAX_ROWS: usize = 64;

impl DenseFfnLayer {
    /// A SiLU layer sized by the context.
    pub fn new(ctx: &ForwardContext) -> Self {
        Self::new_with_activation(ctx, Activation::Silu)
    }

    /// A layer with the given activation.
    pub fn new_with_activation(ctx: &ForwardContext, activation: Activation) -> Self {
        DenseFfnLayer {
            hidden: ctx.config.hidden,
            inter: ctx.config.inter,
            activation,
            weights: DenseFfnWeights::default(),
            bf16: None,
            fp8: None,
            w8a8: None,
            lora: None,
            q2: None,
            kernels: FfnKernels::resolve(ctx.backend.as_ref()),
        }
    }

    /// The resolved kernels.
    pub fn kernels(&self) -> &FfnKernels {
        &self.kernels
    }

    fn check_shape(&self, what: &str, p: P, n: usize, k: usize) -> GpuResult<()> {
        let want = match p {
            P::Gate | P::Up => (self.inter, self.hidden),
            P::Down => (self.hidden, self.inter),
        };
        if (n, k) != want {
            return Err(GpuError::Invalid(format!(
                "{what} {p:?}: shape [{n}, {k}], this layer needs [{}, {}] ([inter, hidden] for gate/up, [hidden, inter] for down)",
                want.0, want.1
            )));
        }
        Ok(())
    }

    /// Install the BF16 overlay (`bf16` layout).
    pub fn set_bf16_weights(
        &mut self,
        gate: Bf16Weight,
        up: Bf16Weight,
        down: Bf16Weight,
    ) -> GpuResult<()> {
        for (p, w) in [(P::Gate, &gate), (P::Up, &up), (P::Down, &down)] {
            self.check_shape("set_bf16_weights", p, w.n, w.k)?;
            if w.k % 8 != 0
                || w.kp < w.k
                || w.kp % 8 != 0
                || w.weight.bytes < (w.n * w.kp * 2) as u64
            {
                return Err(GpuError::Invalid(format!(
                    "set_bf16_weights {p:?}: k {} / kp {} / {} bytes do not fit the bf16 layout",
                    w.k, w.kp, w.weight.bytes
                )));
            }
        }
        self.bf16 = Some([gate, up, down]);
        Ok(())
    }

    /// Install the native block-scaled FP8 overlay (`fp8` layout).
    pub fn set_fp8_weights(
        &mut self,
        gate: Fp8Weight,
        up: Fp8Weight,
        down: Fp8Weight,
    ) -> GpuResult<()> {
        for (p, w) in [(P::Gate, &gate), (P::Up, &up), (P::Down, &down)] {
            self.check_shape("set_fp8_weights", p, w.n, w.k)?;
            check_fp8(w, &format!("set_fp8_weights {p:?}"))?;
        }
        self.fp8 = Some(Fp8Overlay {
            gate,
            up,
            down,
            fused: None,
        });
        Ok(())
    }

    /// Install the fused `[2*inter, hidden]` FP8 gate+up weight whose views the installed gate
    /// and up are (gate = rows `[0, inter)`, up = rows `[interp, interp + inter)`).
    pub fn set_fp8_gate_up_fused(&mut self, fused: Fp8Weight) -> GpuResult<()> {
        let interp = round_up(self.inter, 128);
        let ov = self.fp8.as_mut().ok_or_else(|| {
            GpuError::Invalid("set_fp8_gate_up_fused: install set_fp8_weights first".into())
        })?;
        debug_assert_eq!(
            ov.gate.weight.addr, fused.weight.addr,
            "gate must be a view of the fused weight"
        );
        if ov.gate.weight.addr != fused.weight.addr
            || ov.up.weight.addr != fused.weight.addr + (interp * fused.kp) as u64
        {
            return Err(GpuError::Invalid(
                "set_fp8_gate_up_fused: gate and up are not views of the fused weight".into(),
            ));
        }
        if fused.n != 2 * interp || fused.k != self.hidden {
            return Err(GpuError::Invalid(format!(
                "set_fp8_gate_up_fused: shape [{}, {}], needs [{}, {}]",
                fused.n,
                fused.k,
                2 * interp,
                self.hidden
            )));
        }
        check_fp8(&fused, "set_fp8_gate_up_fused")?;
        ov.fused = Some(fused);
        Ok(())
    }

    /// Install the declared-W8A8 decode weights (`w8a8` layout). Refused for a GELU FFN and for
    /// shapes other than `[inter, hidden]` (gate, up) and `[hidden, inter]` (down).
    pub fn set_w8a8_decode_weights(
        &mut self,
        w: [W8a8Weight; 3],
        hidden: usize,
        inter: usize,
    ) -> GpuResult<()> {
        if self.activation == Activation::Gelu {
            return Err(GpuError::Invalid(
                "set_w8a8_decode_weights: the W8A8 decode arm refuses a GELU FFN".into(),
            ));
        }
        if (hidden, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Invalid(format!(
                "set_w8a8_decode_weights: hidden/inter {hidden}/{inter}, layer is {}/{}",
                self.hidden, self.inter
            )));
        }
        for (p, x) in [(P::Gate, &w[0]), (P::Up, &w[1]), (P::Down, &w[2])] {
            self.check_shape("set_w8a8_decode_weights", p, x.n, x.k)?;
            if x.kp % 128 != 0
                || x.kp < x.k
                || x.weight.bytes < (x.n * x.kp) as u64
                || x.scale.bytes < (x.n * 4) as u64
            {
                return Err(GpuError::Invalid(format!(
                    "set_w8a8_decode_weights {p:?}: kp {} / buffers do not fit the w8a8 layout",
                    x.kp
                )));
            }
        }
        self.w8a8 = Some(w);
        Ok(())
    }

    /// Install the NVFP4 base (`nvfp4` layout: ModelOpt codes and scales, K padded to 64).
    pub fn set_nvfp4_weights(&mut self, w: [Nvfp4Weight; 3]) -> GpuResult<()> {
        for (p, x) in [(P::Gate, &w[0]), (P::Up, &w[1]), (P::Down, &w[2])] {
            self.check_shape("set_nvfp4_weights", p, x.n, x.k)?;
            if x.k % 32 != 0
                || x.kp % 64 != 0
                || x.kp < x.k
                || x.codes.bytes < (x.n * x.kp / 2) as u64
                || x.scales.bytes < (x.n * x.kp / 16) as u64
            {
                return Err(GpuError::Invalid(format!(
                    "set_nvfp4_weights {p:?}: k {} / kp {} / buffers do not fit the nvfp4 layout (k % 32, kp % 64)",
                    x.k, x.kp
                )));
            }
        }
        self.weights.nvfp4 = Some(w);
        Ok(())
    }

    /// Install the transposed `_t` copies (`nvfp4_t` layout) the `w4a16_gemm_t*` prefill GEMMs
    /// read, per projection (gate, up, down). Needs the `nvfp4` base installed first.
    pub fn set_nvfp4_t_weights(&mut self, t: [Option<Nvfp4TWeight>; 3]) -> GpuResult<()> {
        let Some(w) = self.weights.nvfp4 else {
            return Err(GpuError::Invalid(
                "set_nvfp4_t_weights: install the nvfp4 base first".into(),
            ));
        };
        for (p, (x, base)) in t.iter().zip(w.iter()).enumerate() {
            if let Some(x) = x
                && (x.np != base.n.div_ceil(64) * 64
                    || x.codes.bytes < (base.kp * x.np / 2) as u64
                    || x.scales.bytes < (base.kp / 16 * x.np) as u64)
            {
                return Err(GpuError::Invalid(format!(
                    "set_nvfp4_t_weights projection {p}: np {} / buffers do not fit the nvfp4_t layout of [{}, {}]",
                    x.np, base.n, base.kp
                )));
            }
        }
        self.weights.nvfp4_t = t;
        Ok(())
    }

    /// Drop the `_t` copies of the first `count` projections (gate, up, down), freeing those
    /// the layer allocated; views into a loaded pack are only dropped.
    fn drop_t_copies(&mut self, b: &dyn GpuBackend, count: usize) {
        for t in self.weights.nvfp4_t.iter_mut().take(count) {
            if let Some(t) = t.take()
                && t.owned
            {
                b.free(t.codes);
                b.free(t.scales);
            }
        }
    }

    /// Load-time setup of the NVFP4 MMQ prefill arm: repack gate and up (and down unless
    /// `METRALE_NO_FFN_NVFP4_MMQ_DOWN`) into the `nvfp4_mmq` tiles on the GPU, synchronize, and
    /// free the `_t` copies of what it repacked. Returns at once (false) for FP8 (or packed-Q2)
    /// layers, GELU layers, a missing kernel, `METRALE_NO_FFN_NVFP4_MMQ`, a layer without NVFP4
    /// weights, and for each projection whose tiles were given (a pack). True when it repacked.
    pub fn finalize_nvfp4_mmq_load(
        &mut self,
        ctx: &mut ForwardContext,
        h: usize,
        inter: usize,
        stream: StreamId,
    ) -> GpuResult<bool> {
        if self.fp8.is_some()
            || self.q2.is_some()
            || self.activation == Activation::Gelu
            || !self.kernels.nvfp4_repack.ok()
            || ctx.levers.no_ffn_nvfp4_mmq
        {
            return Ok(false);
        }
        let Some(w) = self.weights.nvfp4 else {
            return Ok(false);
        };
        if (h, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Invalid(format!(
                "finalize_nvfp4_mmq_load: {h}/{inter}, layer is {}/{}",
                self.hidden, self.inter
            )));
        }
        let count = if ctx.levers.no_ffn_nvfp4_mmq_down {
            2
        } else {
            3
        };
        let mut did = false;
        for (p, &x) in w.iter().enumerate().take(count) {
            if self.weights.nvfp4_mmq[p].is_some() {
                continue;
            }
            let np = round_up(x.n, 128);
            let out = ctx.backend.alloc((np / 128 * x.kp / 64 * 4608) as u64)?;
            let threads = np / 128 * x.kp / 64 * 128;
            let cfg = LaunchCfg::grid(threads.div_ceil(256), 1, 256);
            let i = |v: usize| KArg::I32(v as i32);
            ctx.trace.push("nvfp4_mmq_repack");
            ctx.backend.launch(
                self.kernels.nvfp4_repack,
                cfg,
                stream,
                &[
                    KArg::Ptr(x.codes),
                    KArg::Ptr(x.scales),
                    i(x.n),
                    i(np),
                    i(x.kp),
                    KArg::Ptr(out),
                ],
            )?;
            self.weights.nvfp4_mmq[p] = Some(out);
            did = true;
        }
        if did {
            ctx.backend.synchronize(stream)?;
            self.drop_t_copies(ctx.backend.as_ref(), count);
        }
        Ok(did)
    }

    /// Install a LoRA adapter (`lora` layout) per projection (gate, up, down; any may be absent)
    /// on the NVFP4 base. Refused while an FP8, BF16 or packed-Q2 overlay is installed, and when
    /// the layer cannot take the split-SiLU decode path (SiLU, `act_mul_silu` and `w4a16_gemv`
    /// resolved), with those words.
    pub fn set_lora_weights(&mut self, w: [Option<LoraWeight>; 3]) -> GpuResult<()> {
        if self.fp8.is_some() || self.bf16.is_some() || self.q2.is_some() {
            return Err(GpuError::Invalid(
                "set_lora_weights: refused while an FP8, BF16 or packed-Q2 overlay is installed (LoRA applies to the NVFP4 arms only)".into(),
            ));
        }
        if self.activation != Activation::Silu
            || !self.kernels.act_silu.ok()
            || !self.kernels.nvfp4_gemv.ok()
        {
            return Err(GpuError::Invalid(
                "set_lora_weights: refused: the layer cannot take the split-SiLU decode path (needs SiLU, act_mul_silu and w4a16_gemv)".into(),
            ));
        }
        if self.weights.nvfp4.is_none() {
            return Err(GpuError::Invalid(
                "set_lora_weights: install the NVFP4 base first".into(),
            ));
        }
        for (p, x) in [P::Gate, P::Up, P::Down].into_iter().zip(w.iter()) {
            let Some(x) = x else { continue };
            self.check_shape("set_lora_weights", p, x.n, x.k)?;
            if x.rank == 0
                || x.rank > LORA_MAX_RANK
                || x.a.bytes < (2 * x.rank * x.k) as u64
                || x.b.bytes < (2 * x.n * x.rank) as u64
            {
                return Err(GpuError::Invalid(format!(
                    "set_lora_weights {p:?}: rank {} (1..={LORA_MAX_RANK}) or buffers do not fit A [rank, {}] and B [{}, rank] in BF16",
                    x.rank, x.k, x.n
                )));
            }
        }
        self.lora = Some(w);
        Ok(())
    }

    /// A LoRA adapter is installed and `METRALE_LORA_NO_FFN` is off.
    pub fn lora_active(&self, ctx: &ForwardContext) -> bool {
        self.lora.is_some() && !ctx.levers.lora_no_ffn
    }

    /// `out += scaling * B (A x)` for one projection's adapter: `lora_a` then `lora_b_add`.
    #[allow(clippy::too_many_arguments)]
    fn lora_project(
        &self,
        ctx: &mut ForwardContext,
        l: &LoraWeight,
        x: DevicePtr,
        m: usize,
        out: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = &self.kernels;
        if !k.lora_a.ok() {
            return Err(missing("ffn_lora", "lora_a"));
        }
        if !k.lora_b.ok() {
            return Err(missing("ffn_lora", "lora_b_add"));
        }
        let a = |v: usize| KArg::I32(v as i32);
        let xa = ctx.arena.lora_xa.view(0, (m * l.rank * 4) as u64);
        let cfg = LaunchCfg::grid(l.rank.div_ceil(8), m, 256);
        let args = [
            KArg::Ptr(x),
            a(m),
            a(l.k),
            a(l.k),
            KArg::Ptr(l.a),
            a(l.rank),
            KArg::Ptr(xa),
        ];
        self.launch(ctx, k.lora_a, cfg, &args)?;
        let cfg = LaunchCfg::grid(l.n.div_ceil(256), m, 256);
        let args = [
            KArg::Ptr(xa),
            a(m),
            a(l.rank),
            KArg::Ptr(l.b),
            KArg::F32(l.scaling),
            KArg::Ptr(out),
            a(l.n),
            a(ldy),
        ];
        self.launch(ctx, k.lora_b, cfg, &args)
    }

    /// After the gate and up projections, before the activation: `gate_out += dW_gate x`,
    /// `up_out += dW_up x`. No launch without an adapter or with `METRALE_LORA_NO_FFN=1`.
    pub fn apply_lora_gate_up(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        gate_out: DevicePtr,
        up_out: DevicePtr,
    ) -> GpuResult<()> {
        if !self.lora_active(ctx) {
            return Ok(());
        }
        let w = self.lora.unwrap();
        if let Some(l) = w[0] {
            self.lora_project(ctx, &l, x, m, gate_out, self.inter)?;
        }
        if let Some(l) = w[1] {
            self.lora_project(ctx, &l, x, m, up_out, self.inter)?;
        }
        Ok(())
    }

    /// After the down projection: `output += dW_down act` on the materialised
    /// `silu(gate) * up`. No launch without an adapter or with `METRALE_LORA_NO_FFN=1`.
    pub fn apply_lora_down(
        &self,
        ctx: &mut ForwardContext,
        act: DevicePtr,
        m: usize,
        output: DevicePtr,
    ) -> GpuResult<()> {
        if !self.lora_active(ctx) {
            return Ok(());
        }
        if let Some(l) = self.lora.unwrap()[2] {
            self.lora_project(ctx, &l, act, m, output, self.hidden)?;
        }
        Ok(())
    }

    /// Load-time setup of the Q4_K MMQ prefill arm (`METRALE_FFN_MMQ=1`): builds on the GPU,
    /// from the NVFP4 base, gate and up as Q4_K (byte-identical to the converter's encoder, so to
    /// ggml's reference quantizer) and down as int8 rows (when `int8_gemm_faith2` and
    /// `requant_a_bf16_int8` resolved and `METRALE_FFN_MMQ_DOWN_Q4K` is unset) or Q4_K;
    /// synchronizes; frees the `_t` copies. Returns at once (false) for packed-Q2 or FP8 layers,
    /// when one of its four Q4_K kernels (`nvfp4_to_q4k`, `nvfp4_to_int8_rows`,
    /// `quantize_act_q8_1`, `q4k_mmq_gemm`) is missing, without the lever, without NVFP4 weights,
    /// or when the copies were given (a pack).
    pub fn finalize_q4k_load(
        &mut self,
        ctx: &mut ForwardContext,
        h: usize,
        inter: usize,
        stream: StreamId,
    ) -> GpuResult<bool> {
        let k = self.kernels;
        if self.q2.is_some()
            || self.fp8.is_some()
            || !(k.q4k_encode.ok()
                && k.q4k_int8_encode.ok()
                && k.q4k_gemm.ok()
                && k.quant_q8_1.ok())
            || !ctx.levers.ffn_mmq
            || self.weights.q4k.is_some()
        {
            return Ok(false);
        }
        let Some(w) = self.weights.nvfp4 else {
            return Ok(false);
        };
        if (h, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Invalid(format!(
                "finalize_q4k_load: {h}/{inter}, layer is {}/{}",
                self.hidden, self.inter
            )));
        }
        let (kp_gate, kp_down) = (round_up(h, 256), round_up(inter, 256));
        let i = |v: usize| KArg::I32(v as i32);
        let b = ctx.backend.clone();
        let encode =
            |ctx: &mut ForwardContext, x: &Nvfp4Weight, kp_q: usize| -> GpuResult<DevicePtr> {
                let out = b.alloc((x.n * kp_q / 256 * 144) as u64)?;
                let cfg = LaunchCfg::grid((x.n * kp_q / 256).div_ceil(64), 1, 64);
                ctx.trace.push("nvfp4_to_q4k");
                b.launch(
                    k.q4k_encode,
                    cfg,
                    stream,
                    &[
                        KArg::Ptr(x.codes),
                        KArg::Ptr(x.scales),
                        KArg::F32(x.global_scale),
                        i(x.n),
                        i(x.k),
                        i(x.kp),
                        i(kp_q),
                        KArg::Ptr(out),
                    ],
                )?;
                Ok(out)
            };
        let gate = encode(ctx, &w[0], kp_gate)?;
        let up = encode(ctx, &w[1], kp_gate)?;
        let d = &w[2];
        let down = if k.int8_gemm.ok() && k.requant_int8.ok() && !ctx.levers.ffn_mmq_down_q4k {
            let codes = b.alloc((d.n * kp_down) as u64)?;
            let scales = b.alloc((d.n * 4) as u64)?;
            let cfg = LaunchCfg::grid(d.n, 1, 256);
            ctx.trace.push("nvfp4_to_int8_rows");
            b.launch(
                k.q4k_int8_encode,
                cfg,
                stream,
                &[
                    KArg::Ptr(d.codes),
                    KArg::Ptr(d.scales),
                    KArg::F32(d.global_scale),
                    i(d.n),
                    i(d.k),
                    i(d.kp),
                    i(kp_down),
                    KArg::Ptr(codes),
                    KArg::Ptr(scales),
                ],
            )?;
            Q4kDown::Int8 { codes, scales }
        } else {
            Q4kDown::Q4k(encode(ctx, d, kp_down)?)
        };
        b.synchronize(stream)?;
        self.drop_t_copies(b.as_ref(), 3);
        self.weights.q4k = Some(Q4kMmqWeights {
            gate,
            up,
            down,
            kp_gate,
            kp_down,
            owned: true,
        });
        Ok(true)
    }

    /// Install the packed Q2_0-g128 overlay (`q2g128` layout). Its arms: decode through
    /// `q2_0_gemv_vec`, 2-3 rows through `forward_km_q2`, prefill (SiLU only) through the Q2 MMQ
    /// GEMM (`METRALE_GGUF_NATIVE_Q2_MMQ=1`) or dequantize-to-BF16 plus the BF16 GEMM.
    pub fn set_q2_weights(
        &mut self,
        gate: Q2Weight,
        up: Q2Weight,
        down: Q2Weight,
    ) -> GpuResult<()> {
        for (p, w) in [(P::Gate, &gate), (P::Up, &up), (P::Down, &down)] {
            self.check_shape("set_q2_weights", p, w.n, w.k)?;
            if !w.kp.is_multiple_of(128)
                || w.kp < w.k
                || w.blocks.bytes < (w.n * w.kp / 128 * 34) as u64
            {
                return Err(GpuError::Invalid(format!(
                    "set_q2_weights {p:?}: kp {} / {} bytes do not fit the q2g128 layout of [{}, {}] (kp % 128, 34 bytes per 128)",
                    w.kp, w.blocks.bytes, w.n, w.k
                )));
            }
        }
        self.q2 = Some([gate, up, down]);
        Ok(())
    }

    /// Whether an FP8 overlay is installed.
    pub fn has_fp8(&self) -> bool {
        self.fp8.is_some()
    }

    // ---- routing predicates ----

    /// The rows the narrow (GEMV) arms serve: 16 with `METRALE_FFN_BATCH16` and its kernel, else 4.
    pub fn narrow_rows(&self, ctx: &ForwardContext) -> usize {
        if ctx.levers.ffn_batch16 && self.kernels.fp8_b16.ok() {
            16
        } else {
            4
        }
    }

    /// The NVFP4 batch-m tier kernel for `m` rows, if resolved.
    pub fn batchm_kernel(&self, m: usize) -> Option<KernelHandle> {
        let k = match m {
            1..=4 => self.kernels.nvfp4_small_m4,
            5..=8 => self.kernels.nvfp4_small_m8,
            9..=16 => self.kernels.nvfp4_small_m16,
            _ => return None,
        };
        k.ok().then_some(k)
    }

    /// `forward_km(m)` is available: a batch-m tier resolved and the layer has NVFP4 gate
    /// weights or an FP8 overlay.
    pub fn can_forward_km(&self, m: usize) -> bool {
        self.batchm_kernel(m).is_some() && (self.weights.nvfp4.is_some() || self.fp8.is_some())
    }

    /// W4A4 for 2-3 rows (NVFP4 layers, `METRALE_SMALL_BATCH_W4A4`, the W4A4 tier resolved).
    pub fn small_batch_w4a4(&self, ctx: &ForwardContext) -> bool {
        ctx.levers.small_batch_w4a4
            && self.weights.nvfp4.is_some()
            && self.kernels.nvfp4_proj_mx.ok()
    }

    /// W4A4 for one decode row (NVFP4 layers, `METRALE_SINGLE_ROW_W4A4`, the tier resolved).
    pub fn single_row_w4a4(&self, ctx: &ForwardContext) -> bool {
        ctx.levers.single_row_w4a4
            && self.weights.nvfp4.is_some()
            && self.kernels.nvfp4_proj_mx.ok()
    }

    /// The fixed activation-quantization path serves `m` rows: the W8A8 arm or the W4A4 arm.
    pub fn fixed_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        self.fixed_w8a8_ok(ctx, m) || self.fixed_w4a4_ok(ctx, m)
    }

    /// The fixed W8A8 arm: W8A8 weights installed, SiLU, its two kernels resolved, and the
    /// declared format `w8a8` or none.
    pub fn fixed_w8a8_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        let declared = ctx
            .levers
            .activation_quantization
            .as_deref()
            .is_none_or(|f| f == "w8a8");
        declared
            && self.w8a8.is_some()
            && self.activation == Activation::Silu
            && self.kernels.quant_fp8_row.ok()
            && self.kernels.w8a8.ok()
            && (1..=ctx.max_tokens).contains(&m)
    }

    /// The fixed W4A4 arm: SiLU layers with NVFP4 weights (the format is NVFP4) when no format
    /// or A4 (`w4a4`, `a4`, `nvfp4`) is declared, `quantize_act_nvfp4` and `nvfp4_proj_mx`
    /// resolved. NVFP4 activation quantization at every row count.
    pub fn fixed_w4a4_ok(&self, ctx: &ForwardContext, m: usize) -> bool {
        self.weights.nvfp4.is_some()
            && self.activation == Activation::Silu
            && ctx
                .levers
                .activation_quantization
                .as_deref()
                .is_none_or(declared_a4)
            && self.kernels.quant_nvfp4.ok()
            && self.kernels.nvfp4_proj_mx.ok()
            && (1..=ctx.max_tokens).contains(&m)
    }

    /// `forward_km(m)` of an NVFP4 layer runs W4A4: one row with `single_row_w4a4`, 2-3 rows
    /// with `small_batch_w4a4`, any row count with A4 declared.
    fn km_w4a4(&self, ctx: &ForwardContext, m: usize) -> bool {
        let declared = ctx
            .levers
            .activation_quantization
            .as_deref()
            .is_some_and(declared_a4);
        (m == 1 && self.single_row_w4a4(ctx))
            || ((2..=3).contains(&m) && self.small_batch_w4a4(ctx))
            || (declared
                && self.weights.nvfp4.is_some()
                && self.kernels.nvfp4_proj_mx.ok()
                && self.kernels.quant_nvfp4.ok())
    }

    /// The fused FP8 gate+up GEMV serves decode: fused weight installed, lever on, kernel resolved.
    pub fn gateup_fused_plan(&self, ctx: &ForwardContext) -> bool {
        self.fp8.as_ref().is_some_and(|o| o.fused.is_some())
            && ctx.levers.ffn_gateup_fused
            && self.kernels.fp8_b4.ok()
    }

    // ---- methods ----

    fn check_rows(&self, ctx: &ForwardContext, input: DevicePtr, m: usize) -> GpuResult<()> {
        if m == 0 || m > ctx.max_tokens {
            return Err(GpuError::Invalid(format!(
                "{m} rows: the context holds 1..={}",
                ctx.max_tokens
            )));
        }
        if input.bytes < (m * self.hidden * 4) as u64 {
            return Err(GpuError::Invalid(format!(
                "input holds {} bytes, {m} rows of {} f32 need {}",
                input.bytes,
                self.hidden,
                m * self.hidden * 4
            )));
        }
        Ok(())
    }

    /// One decode row. Returns `moe_output` holding `[1, hidden]`.
    pub fn forward(&self, ctx: &mut ForwardContext, input: DevicePtr) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, 1)?;
        if self.w8a8.is_some() && self.fixed_w8a8_ok(ctx, 1) {
            return self.w8a8_arm(ctx, input, 1);
        }
        if self.q2.is_some() {
            return self.q2_gemv_arm(ctx, input, 1);
        }
        if self.fp8.is_some() {
            if self.gateup_fused_plan(ctx) {
                return self.fp8_fused_decode(ctx, input);
            }
            return self.fp8_arm(ctx, input, 1);
        }
        if let Some(w) = self.bf16 {
            if self.kernels.bf16_gemv.ok() {
                return self.bf16_gemv_arm(ctx, input, 1, &w);
            }
            return self.forward_prefill(ctx, input, 1);
        }
        if self.weights.nvfp4.is_some() {
            if self.single_row_w4a4(ctx) {
                return self.forward_km(ctx, input, 1);
            }
            if ctx.levers.decode_ffn_via_gemm {
                return self.forward_prefill(ctx, input, 1);
            }
            return self.nvfp4_gemv_arm(ctx, input, 1);
        }
        Err(GpuError::Invalid("forward: no weights installed".into()))
    }

    /// Two rows: FP8/BF16 layers go to `forward_prefill`.
    pub fn forward_k2(&self, ctx: &mut ForwardContext, input: DevicePtr) -> GpuResult<DevicePtr> {
        self.forward_small(ctx, input, 2)
    }

    /// Three rows: FP8/BF16 layers go to `forward_prefill`.
    pub fn forward_k3(&self, ctx: &mut ForwardContext, input: DevicePtr) -> GpuResult<DevicePtr> {
        self.forward_small(ctx, input, 3)
    }

    fn forward_small(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, m)?;
        if self.q2.is_some() {
            return self.forward_km_q2(ctx, input, m);
        }
        if self.w8a8.is_some() || self.fp8.is_some() || self.bf16.is_some() {
            return self.forward_prefill(ctx, input, m);
        }
        if self.weights.nvfp4.is_some() {
            if self.small_batch_w4a4(ctx) && self.can_forward_km(m) {
                return self.forward_km(ctx, input, m);
            }
            // The batch-4 GEMVs serve 2 and 3 rows (the engine's w4a16_gemv_dual_batch2|3).
            return self.nvfp4_gemv_arm(ctx, input, m);
        }
        Err(GpuError::Invalid("forward: no weights installed".into()))
    }

    /// `m` verify rows: FP8/BF16 layers go to `forward_prefill`; NVFP4 through the batch-m tier.
    pub fn forward_km(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, m)?;
        if self.fp8.is_some() || self.bf16.is_some() {
            return self.forward_prefill(ctx, input, m);
        }
        if let Some(w) = self.weights.nvfp4 {
            if self.km_w4a4(ctx, m) {
                return self.w4a4_arm(ctx, input, m);
            }
            let Some(k) = self.batchm_kernel(m) else {
                return Err(match m {
                    1..=16 => missing("ffn_nvfp4", "nvfp4_proj_small_m4|8|16"),
                    _ => GpuError::Invalid(format!(
                        "forward_km: {m} rows, the batch-m tiers serve 1..=16"
                    )),
                });
            };
            let pw = [(k, w[0]), (k, w[1]), (k, w[2])];
            return self.gated(ctx, input, m, true, &pw, Self::nvfp4_small_m_project);
        }
        Err(GpuError::Invalid(
            "forward_km: no NVFP4 or FP8 weights".into(),
        ))
    }

    /// Prefill of `num_tokens` rows. Arm order: declared W8A8 (up to `w8a8_max_rows`), packed
    /// Q2, FP8, BF16, NVFP4: the first installed serves the call.
    pub fn forward_prefill(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        num_tokens: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, num_tokens)?;
        let t0 = if ctx.profile {
            ctx.backend.synchronize(ctx.stream)?;
            Some(std::time::Instant::now())
        } else {
            None
        };
        let m = num_tokens;
        let out = if self.w8a8.is_some()
            && m <= ctx.levers.w8a8_max_rows
            && self.fixed_w8a8_ok(ctx, m)
        {
            self.w8a8_arm(ctx, input, m)
        } else if self.q2.is_some() {
            self.q2_prefill_arm(ctx, input, m)
        } else if self.fp8.is_some() {
            self.fp8_arm(ctx, input, m)
        } else if let Some(w) = self.bf16 {
            self.bf16_prefill_arm(ctx, input, m, &w)
        } else if self.weights.nvfp4.is_some() && ctx.levers.ffn_mmq && self.weights.q4k.is_some() {
            self.q4k_mmq_arm(ctx, input, m)
        } else if let Some(w) = self.weights.nvfp4 {
            let pw = [(0, w[0]), (1, w[1]), (2, w[2])];
            self.gated(ctx, input, m, true, &pw, Self::w4a16_prefill_gemm)
        } else if self.w8a8.is_some() {
            Err(GpuError::Invalid(format!(
                "forward_prefill: {m} rows exceed the W8A8 arm's {} and no other weights are installed",
                ctx.levers.w8a8_max_rows
            )))
        } else {
            Err(GpuError::Invalid(
                "forward_prefill: no weights installed".into(),
            ))
        }?;
        if let Some(t0) = t0 {
            ctx.backend.synchronize(ctx.stream)?;
            tracing::info!(
                "FFN prefill [dense_total] N={m}: {}µs",
                t0.elapsed().as_micros()
            );
        }
        Ok(out)
    }

    /// The same as `forward_prefill`.
    pub fn forward_batched(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        num_tokens: usize,
    ) -> GpuResult<DevicePtr> {
        self.forward_prefill(ctx, input, num_tokens)
    }

    /// The fixed `--activation-quantization` path: one activation format (per-row FP8 for W8A8,
    /// per-row NVFP4 for W4A4) at every row count, so a row's output bits do not depend on the
    /// batch.
    pub fn forward_fixed(
        &self,
        ctx: &mut ForwardContext,
        input: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, input, m)?;
        if self.fixed_w8a8_ok(ctx, m) {
            return self.w8a8_arm(ctx, input, m);
        }
        if self.fixed_w4a4_ok(ctx, m) {
            return self.w4a4_arm(ctx, input, m);
        }
        Err(GpuError::Invalid("forward_fixed: no fixed-quantization arm serves this layer (needs SiLU and W8A8 weights with the W8A8 kernels, or NVFP4 weights with quantize_act_nvfp4 and nvfp4_proj_mx)".into()))
    }

    // ---- arms ----

    fn launch(
        &self,
        ctx: &mut ForwardContext,
        k: KernelHandle,
        cfg: LaunchCfg,
        args: &[KArg],
    ) -> GpuResult<()> {
        ctx.trace.push(name_of(k, &self.kernels));
        ctx.backend.launch(k, cfg, ctx.stream, args)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn act_mul(
        &self,
        ctx: &mut ForwardContext,
        g: DevicePtr,
        u: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        gs: usize,
        us: usize,
        os: usize,
    ) -> GpuResult<()> {
        let (k, name) = match self.activation {
            Activation::Silu => (self.kernels.act_silu, "act_mul_silu"),
            Activation::Gelu => (self.kernels.act_gelu, "act_mul_gelu"),
        };
        if !k.ok() {
            return Err(missing("ffn_act", name));
        }
        let cfg = LaunchCfg::grid(cols.div_ceil(256), rows, 256);
        let i = |v: usize| KArg::I32(v as i32);
        self.launch(
            ctx,
            k,
            cfg,
            &[
                KArg::Ptr(g),
                KArg::Ptr(u),
                KArg::Ptr(out),
                i(rows),
                i(cols),
                i(gs),
                i(us),
                i(os),
            ],
        )
    }

    /// The FP8 projection kernel for `m` rows: the first that resolved of batch-4 GEMV (m <= 4),
    /// tensor-core m16 (5..=32 with `ffn_m16_tc`), batch-16 GEMV (5..=32 with
    /// `METRALE_FFN_BATCH16`), the W8A8 block GEMM (when selected), the pipelined tensor-core
    /// GEMM, the base GEMM.
    pub(crate) fn fp8_kernel_for(&self, lev: &ModelLevers, m: usize) -> GpuResult<KernelHandle> {
        let k = &self.kernels;
        Ok(if m <= 4 && k.fp8_b4.ok() {
            k.fp8_b4
        } else if (5..=32).contains(&m) && lev.ffn_m16_tc && k.fp8_m16.ok() {
            k.fp8_m16
        } else if (5..=32).contains(&m) && lev.ffn_batch16 && k.fp8_b16.ok() {
            k.fp8_b16
        } else if lev.fp8_w8a8_gemm && k.fp8_w8a8_block.ok() {
            return Err(missing("ffn_fp8", "w8a8_block_gemm"));
        } else if k.fp8_pipe.ok() {
            k.fp8_pipe
        } else if k.fp8_base.ok() {
            k.fp8_base
        } else {
            return Err(missing("ffn_fp8", "w8a16_gemm"));
        })
    }

    /// One FP8 projection `y[m, ldy] = x[m, k] . W^T`, by the routed kernel.
    fn fp8_project(
        &self,
        ctx: &mut ForwardContext,
        w: &Fp8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let kernel = self.fp8_kernel_for(&ctx.levers, m)?;
        self.fp8_launch(ctx, kernel, w, x, m, y, ldy)
    }

    /// Launch FP8 projection kernel `kernel` over `m` rows (in chunks of its row cap).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fp8_launch(
        &self,
        ctx: &mut ForwardContext,
        kernel: KernelHandle,
        w: &Fp8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = &self.kernels;
        let (cap, tile) = if kernel == k.fp8_b4 {
            (4, "gemv4")
        } else if kernel == k.fp8_b16 {
            (16, "gemv16")
        } else if kernel == k.fp8_m16 {
            (16, "m16")
        } else if kernel == k.fp8_pipe {
            (usize::MAX, "tc64")
        } else {
            (usize::MAX, "simt64")
        };
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(cap);
            let grid = match tile {
                "gemv4" => (w.n.div_ceil(32) as u32, 1, 1),
                "gemv16" => (w.n.div_ceil(16) as u32, 1, 1),
                "m16" => ((w.np / 128) as u32, 1, 1),
                "tc64" => ((w.np / 128) as u32, rows.div_ceil(64) as u32, 1),
                _ => (w.n.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
            };
            let block = match tile {
                "gemv4" | "gemv16" | "simt64" => (256, 1, 1),
                _ => (128, 1, 1),
            };
            let xs = x.view((r0 * w.k * 4) as u64, (rows * w.k * 4) as u64);
            let ys = y.view(
                (r0 * ldy * 4) as u64,
                ((rows - 1) * ldy * 4 + w.n * 4) as u64,
            );
            let i = |v: usize| KArg::I32(v as i32);
            let args = [
                KArg::Ptr(xs),
                i(rows),
                KArg::Ptr(w.weight),
                KArg::Ptr(w.scale),
                KArg::Ptr(ys),
                i(w.n),
                i(w.k),
                i(w.kp),
                i(ldy),
            ];
            self.launch(
                ctx,
                kernel,
                LaunchCfg {
                    grid,
                    block,
                    smem: 0,
                },
                &args,
            )?;
            r0 += rows;
        }
        Ok(())
    }

    fn fp8_arm(&self, ctx: &mut ForwardContext, x: DevicePtr, m: usize) -> GpuResult<DevicePtr> {
        let ov = self.fp8.as_ref().unwrap();
        self.gated(
            ctx,
            x,
            m,
            false,
            &[ov.gate, ov.up, ov.down],
            Self::fp8_project,
        )
    }

    /// The gated FFN through one projection function: gate and up into the arena, act-mul in
    /// place, down into `moe_output`.
    fn gated<W>(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        lora: bool,
        w: &[W; 3],
        project: fn(
            &Self,
            &mut ForwardContext,
            &W,
            DevicePtr,
            usize,
            DevicePtr,
            usize,
        ) -> GpuResult<()>,
    ) -> GpuResult<DevicePtr> {
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (
            ctx.arena.expert_gate_out,
            ctx.arena.expert_up_out,
            ctx.arena.moe_output,
        );
        project(self, ctx, &w[0], x, m, g, i)?;
        project(self, ctx, &w[1], x, m, u, i)?;
        if lora {
            self.apply_lora_gate_up(ctx, x, m, g, u)?;
        }
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        project(self, ctx, &w[2], act, m, out, h)?;
        if lora {
            self.apply_lora_down(ctx, act, m, out)?;
        }
        Ok(out.view(0, (m * h * 4) as u64))
    }

    fn fp8_fused_decode(&self, ctx: &mut ForwardContext, x: DevicePtr) -> GpuResult<DevicePtr> {
        let ov = self.fp8.as_ref().unwrap();
        let fused = ov.fused.unwrap();
        let interp = fused.np / 2;
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (
            ctx.arena.expert_gate_out,
            ctx.arena.expert_up_out,
            ctx.arena.moe_output,
        );
        self.fp8_project(ctx, &fused, x, 1, g, 2 * interp)?;
        let up_part = g.view((interp * 4) as u64, (i * 4) as u64);
        self.act_mul(ctx, g, up_part, u, 1, i, 2 * interp, 2 * interp, i)?;
        self.fp8_project(ctx, &ov.down, u.view(0, (i * 4) as u64), 1, out, h)?;
        Ok(out.view(0, (h * 4) as u64))
    }

    pub(crate) fn w8a8_project(
        &self,
        ctx: &mut ForwardContext,
        w: &W8a8Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (q, s) = (ctx.arena.act_fp8, ctx.arena.act_scale);
        let i = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid(m, 1, 256);
        self.launch(
            ctx,
            self.kernels.quant_fp8_row,
            cfg,
            &[
                KArg::Ptr(x),
                i(m),
                i(w.k),
                i(w.kp),
                KArg::Ptr(q),
                KArg::Ptr(s),
            ],
        )?;
        let cfg = LaunchCfg::grid(w.n.div_ceil(128), m.div_ceil(64), 128);
        let args = [
            KArg::Ptr(q),
            KArg::Ptr(s),
            i(m),
            KArg::Ptr(w.weight),
            KArg::Ptr(w.scale),
            KArg::Ptr(y),
            i(w.n),
            i(w.kp),
            i(ldy),
        ];
        self.launch(ctx, self.kernels.w8a8, cfg, &args)
    }

    fn w8a8_arm(&self, ctx: &mut ForwardContext, x: DevicePtr, m: usize) -> GpuResult<DevicePtr> {
        self.gated(ctx, x, m, false, &self.w8a8.unwrap(), Self::w8a8_project)
    }

    pub(crate) fn bf16_gemv(
        &self,
        ctx: &mut ForwardContext,
        w: &Bf16Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let i = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid(w.n.div_ceil(8), 1, 256);
        self.launch(
            ctx,
            self.kernels.bf16_gemv,
            cfg,
            &[
                KArg::Ptr(x),
                i(m),
                KArg::Ptr(w.weight),
                KArg::Ptr(y),
                i(w.n),
                i(w.k),
                i(w.kp),
                i(ldy),
            ],
        )
    }

    fn bf16_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        w: &[Bf16Weight; 3],
    ) -> GpuResult<DevicePtr> {
        self.gated(ctx, x, m, false, w, Self::bf16_gemv)
    }

    /// The NVFP4 prefill GEMM of projection `p`: with `nvfp4_mmq` tiles, the MMQ GEMM;
    /// otherwise with a `_t` copy, m <= 64, k % 32 == 0 and `ffn_small_m`: `w4a16_gemm_t_k64`
    /// when k >= `w4a16_k64_min_k` and k % 64 == 0, else `w4a16_gemm_t`; otherwise with a `_t`
    /// copy `w4a16_gemm_t_m128_v2` (k % 64 == 0) or `w4a16_gemm_t_m128`; without `_t` or those
    /// kernels, the base `w4a16_gemm` over the `nvfp4` layout.
    #[allow(clippy::too_many_arguments)]
    fn w4a16_prefill_gemm(
        &self,
        ctx: &mut ForwardContext,
        pw: &(usize, Nvfp4Weight),
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (p, w) = *pw;
        let kk = &self.kernels;
        let a = |v: usize| KArg::I32(v as i32);
        let np128 = w.n.div_ceil(128) * 128;
        if let Some(tiles) = self.weights.nvfp4_mmq[p]
            && kk.nvfp4_mmq_gemm.ok()
        {
            let cfg = LaunchCfg::grid(np128 / 128, m.div_ceil(64), 128);
            let args = [
                KArg::Ptr(x),
                a(m),
                KArg::Ptr(tiles),
                KArg::F32(w.global_scale),
                KArg::Ptr(y),
                a(w.n),
                a(np128),
                a(w.k),
                a(w.kp),
                a(ldy),
            ];
            return self.launch(ctx, kk.nvfp4_mmq_gemm, cfg, &args);
        }
        if let Some(t) = self.weights.nvfp4_t[p] {
            let lev = &ctx.levers;
            let small = m <= 64 && w.k % 32 == 0 && lev.ffn_small_m;
            let k64 = w.k % 64 == 0;
            let pick = if small {
                if k64 && w.k >= lev.w4a16_k64_min_k && kk.nvfp4_gemm_t_k64.ok() {
                    Some((kk.nvfp4_gemm_t_k64, 64))
                } else if kk.nvfp4_gemm_t.ok() {
                    Some((kk.nvfp4_gemm_t, 64))
                } else {
                    None
                }
            } else if k64 && kk.nvfp4_gemm_t_m128_v2.ok() {
                Some((kk.nvfp4_gemm_t_m128_v2, 128))
            } else if w.k % 32 == 0 && kk.nvfp4_gemm_t_m128.ok() {
                Some((kk.nvfp4_gemm_t_m128, 128))
            } else {
                None
            };
            if let Some((k, bm)) = pick {
                let cfg = LaunchCfg::grid(w.n.div_ceil(128), m.div_ceil(bm), 2 * bm);
                let args = [
                    KArg::Ptr(x),
                    a(m),
                    KArg::Ptr(t.codes),
                    KArg::Ptr(t.scales),
                    KArg::F32(w.global_scale),
                    KArg::Ptr(y),
                    a(w.n),
                    a(t.np),
                    a(w.k),
                    a(w.kp),
                    a(ldy),
                ];
                return self.launch(ctx, k, cfg, &args);
            }
        }
        let k = kk.nvfp4_gemm;
        if !k.ok() {
            return Err(missing("ffn_nvfp4", "w4a16_gemm"));
        }
        let cfg = LaunchCfg::grid(w.n.div_ceil(128), m.div_ceil(64), 128);
        let args = [
            KArg::Ptr(x),
            a(m),
            KArg::Ptr(w.codes),
            KArg::Ptr(w.scales),
            KArg::F32(w.global_scale),
            KArg::Ptr(y),
            a(w.n),
            a(w.k),
            a(w.kp),
            a(ldy),
        ];
        self.launch(ctx, k, cfg, &args)
    }

    /// One NVFP4 projection through a GEMV-shaped kernel (`w4a16_gemv*`, the batch-m tiers).
    #[allow(clippy::too_many_arguments)]
    fn nvfp4_gemv_launch(
        &self,
        ctx: &mut ForwardContext,
        k: KernelHandle,
        w: &Nvfp4Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let a = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid(w.n.div_ceil(NVFP4_GEMV_COLS), 1, 256);
        let args = [
            KArg::Ptr(x),
            a(m),
            KArg::Ptr(w.codes),
            KArg::Ptr(w.scales),
            KArg::F32(w.global_scale),
            KArg::Ptr(y),
            a(w.n),
            a(w.k),
            a(w.kp),
            a(ldy),
        ];
        self.launch(ctx, k, cfg, &args)
    }

    /// `forward_km`'s W4A16 projection through the batch-m tier kernel it carries.
    fn nvfp4_small_m_project(
        &self,
        ctx: &mut ForwardContext,
        kw: &(KernelHandle, Nvfp4Weight),
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        self.nvfp4_gemv_launch(ctx, kw.0, &kw.1, x, m, y, ldy)
    }

    /// NVFP4 decode (m <= 3): fused gate+up GEMV (`w4a16_gemv_dual`, `_batch2|3`), then either
    /// act-mul and the down GEMV (split SiLU: the default, and always with GELU or a LoRA
    /// adapter; `w4a16_gemv_ksplit` when k >= `w4a16_gemv_ksplit_min_k`, a lever off by
    /// default) or, with `METRALE_FFN_SILU_FUSED_DOWN` on a SiLU layer, the SiLU-fused down GEMV.
    fn nvfp4_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let k = &self.kernels;
        let pick = |fixed: KernelHandle, base: KernelHandle| if fixed.ok() { fixed } else { base };
        let (dual, down) = match m {
            2 => (
                pick(k.nvfp4_gemv_dual_b2, k.nvfp4_gemv_dual),
                pick(k.nvfp4_gemv_b2, k.nvfp4_gemv),
            ),
            3 => (
                pick(k.nvfp4_gemv_dual_b3, k.nvfp4_gemv_dual),
                pick(k.nvfp4_gemv_b3, k.nvfp4_gemv),
            ),
            _ => (k.nvfp4_gemv_dual, k.nvfp4_gemv),
        };
        if !dual.ok() {
            return Err(missing("ffn_nvfp4", "w4a16_gemv_dual"));
        }
        let w = self.weights.nvfp4.unwrap();
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (
            ctx.arena.expert_gate_out,
            ctx.arena.expert_up_out,
            ctx.arena.moe_output,
        );
        let a = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid(i.div_ceil(NVFP4_GEMV_COLS), 2, 256);
        let args = [
            KArg::Ptr(x),
            a(m),
            KArg::Ptr(w[0].codes),
            KArg::Ptr(w[0].scales),
            KArg::F32(w[0].global_scale),
            KArg::Ptr(g),
            KArg::Ptr(w[1].codes),
            KArg::Ptr(w[1].scales),
            KArg::F32(w[1].global_scale),
            KArg::Ptr(u),
            a(i),
            a(h),
            a(w[0].kp),
            a(i),
        ];
        self.launch(ctx, dual, cfg, &args)?;
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        let d = w[2];
        if self.activation == Activation::Silu
            && ctx.levers.ffn_silu_fused_down
            && k.nvfp4_silu_down.ok()
            && !self.lora_active(ctx)
        {
            let cfg = LaunchCfg::grid(h.div_ceil(NVFP4_GEMV_COLS), 1, 256);
            let args = [
                KArg::Ptr(g),
                KArg::Ptr(u),
                a(m),
                KArg::Ptr(d.codes),
                KArg::Ptr(d.scales),
                KArg::F32(d.global_scale),
                KArg::Ptr(out),
                a(h),
                a(i),
                a(d.kp),
                a(h),
                a(i),
            ];
            self.launch(ctx, k.nvfp4_silu_down, cfg, &args)?;
            return Ok(out.view(0, (m * h * 4) as u64));
        }
        if !down.ok() {
            return Err(missing("ffn_nvfp4", "w4a16_gemv"));
        }
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        let ksplit = ctx.levers.w4a16_gemv_ksplit_min_k;
        if ksplit > 0 && d.k >= ksplit && k.nvfp4_gemv_ksplit.ok() {
            let cfg = LaunchCfg::grid(h.div_ceil(4), 1, 256);
            let args = [
                KArg::Ptr(act),
                a(m),
                KArg::Ptr(d.codes),
                KArg::Ptr(d.scales),
                KArg::F32(d.global_scale),
                KArg::Ptr(out),
                a(h),
                a(i),
                a(d.kp),
                a(h),
            ];
            self.launch(ctx, k.nvfp4_gemv_ksplit, cfg, &args)?;
        } else {
            self.nvfp4_gemv_launch(ctx, down, &d, act, m, out, h)?;
        }
        self.apply_lora_down(ctx, act, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// Quantize `m` rows of `k` f32 activations to NVFP4 (`quantize_act_nvfp4`) into the arena:
    /// codes `[m, kp/2]` then scales `[m, kp/16]` in `act_fp8`, globals in `act_scale`.
    fn quantize_nvfp4(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        k: usize,
        kp: usize,
    ) -> GpuResult<(DevicePtr, DevicePtr, DevicePtr)> {
        if !self.kernels.quant_nvfp4.ok() {
            return Err(missing("ffn_nvfp4", "quantize_act_nvfp4"));
        }
        let qc = ctx.arena.act_fp8.view(0, (m * kp / 2) as u64);
        let qs = ctx
            .arena
            .act_fp8
            .view((m * kp / 2) as u64, (m * kp / 16) as u64);
        let qg = ctx.arena.act_scale.view(0, (m * 4) as u64);
        let a = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid(m, 1, 256);
        let args = [
            KArg::Ptr(x),
            a(m),
            a(k),
            a(kp),
            KArg::Ptr(qc),
            KArg::Ptr(qs),
            KArg::Ptr(qg),
        ];
        self.launch(ctx, self.kernels.quant_nvfp4, cfg, &args)?;
        Ok((qc, qs, qg))
    }

    /// One W4A4 projection (`nvfp4_proj_mx`) over quantized activations.
    #[allow(clippy::too_many_arguments)]
    fn w4a4_project(
        &self,
        ctx: &mut ForwardContext,
        q: (DevicePtr, DevicePtr, DevicePtr),
        m: usize,
        w: &Nvfp4Weight,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let k = self.kernels.nvfp4_proj_mx;
        if !k.ok() {
            return Err(missing("ffn_nvfp4", "nvfp4_proj_mx"));
        }
        let a = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid(w.n.div_ceil(32), m.div_ceil(4), 256);
        let args = [
            KArg::Ptr(q.0),
            KArg::Ptr(q.1),
            KArg::Ptr(q.2),
            a(m),
            KArg::Ptr(w.codes),
            KArg::Ptr(w.scales),
            KArg::F32(w.global_scale),
            KArg::Ptr(y),
            a(w.n),
            a(w.kp),
            a(ldy),
        ];
        self.launch(ctx, k, cfg, &args)
    }

    /// One packed-Q2 projection through `q2_0_gemv_vec` (m = 1) or `q2_0_gemv_vec_batchm`.
    #[allow(clippy::too_many_arguments)]
    fn q2_gemv_project(
        &self,
        ctx: &mut ForwardContext,
        w: &Q2Weight,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let (k, name) = if m == 1 {
            (self.kernels.q2_gemv, "q2_0_gemv_vec")
        } else {
            (self.kernels.q2_gemv_m, "q2_0_gemv_vec_batchm")
        };
        if !k.ok() {
            return Err(missing("ffn_q2", name));
        }
        let a = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid(w.n.div_ceil(8), 1, 256);
        let args = [
            KArg::Ptr(x),
            a(m),
            KArg::Ptr(w.blocks),
            KArg::Ptr(y),
            a(w.n),
            a(w.k),
            a(w.kp),
            a(ldy),
        ];
        self.launch(ctx, k, cfg, &args)
    }

    /// Packed-Q2 decode: gate and up GEMVs, act-mul, down GEMV.
    fn q2_gemv_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let w = self.q2.unwrap();
        self.gated(ctx, x, m, false, &w, Self::q2_gemv_project)
    }

    /// `forward_km_q2`: 2 and 3 rows (up to 4) through `q2_0_gemv_vec_batchm`.
    pub fn forward_km_q2(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        self.check_rows(ctx, x, m)?;
        if self.q2.is_none() {
            return Err(GpuError::Invalid(
                "forward_km_q2: no packed-Q2 weights".into(),
            ));
        }
        if m > 4 {
            return Err(GpuError::Invalid(format!(
                "forward_km_q2: {m} rows, q2_0_gemv_vec_batchm serves 1..=4"
            )));
        }
        let w = self.q2.unwrap();
        self.gated(ctx, x, m, false, &w, Self::q2_gemv_project)
    }

    /// Quantize `m` rows of `k` activations to q8_1 blocks (`quantize_act_q8_1`) into the arena.
    fn quantize_q8_1(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        k: usize,
        kp: usize,
    ) -> GpuResult<DevicePtr> {
        let kq = self.kernels.quant_q8_1;
        if !kq.ok() {
            return Err(missing("ffn_q8_1", "quantize_act_q8_1"));
        }
        let out = ctx.arena.q2_act_q8.view(0, (m * kp / 32 * 36) as u64);
        let a = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::grid((kp / 32).div_ceil(8), m, 256);
        self.launch(
            ctx,
            kq,
            cfg,
            &[KArg::Ptr(x), a(m), a(k), a(kp), KArg::Ptr(out)],
        )?;
        Ok(out)
    }

    /// `y = x . W^T` for a BF16 weight in the arena's dequantization scratch: cuBLAS when the
    /// backend has it, else the BF16 GEMV four rows at a time.
    #[allow(clippy::too_many_arguments)]
    fn bf16_gemm_any(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        xb: DevicePtr,
        w: &Bf16Weight,
        m: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let r = ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: xb,
                w: w.weight,
                y,
                m,
                n: w.n,
                k: w.k,
                kw: w.kp,
            },
            ctx.stream,
        );
        match r {
            Ok(()) => {
                ctx.trace.push("cublas_gemm_bf16");
                Ok(())
            }
            Err(GpuError::MissingKernel { .. }) => {
                if !self.kernels.bf16_gemv.ok() {
                    return Err(missing(
                        "cublas",
                        "gemm_bf16 (and ffn_bf16::bf16_gemv_batch4)",
                    ));
                }
                for r0 in (0..m).step_by(4) {
                    let rows = 4.min(m - r0);
                    let xv = x.view((r0 * w.k * 4) as u64, (rows * w.k * 4) as u64);
                    let yv = y.view((r0 * ldy * 4) as u64, (rows * ldy * 4) as u64);
                    self.bf16_gemv(ctx, w, xv, rows, yv, ldy)?;
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Packed-Q2 prefill, SiLU only: with `METRALE_GGUF_NATIVE_Q2_MMQ=1` and both kernels
    /// resolved (every group is 128 in `q2g128`), the Q2 MMQ GEMM, gate and up sharing one q8_1
    /// quantization of the input and down quantizing the activation; otherwise each projection
    /// dequantized to BF16 into one shared scratch and multiplied by the BF16 GEMM, each
    /// dequant and its GEMM on the stream before the next.
    fn q2_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        if self.activation != Activation::Silu {
            return Err(GpuError::Invalid(
                "packed-Q2 prefill serves SiLU layers only; this layer is GELU".into(),
            ));
        }
        let w = self.q2.unwrap();
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (
            ctx.arena.expert_gate_out,
            ctx.arena.expert_up_out,
            ctx.arena.moe_output,
        );
        let k = &self.kernels;
        if ctx.levers.gguf_native_q2_mmq {
            if !k.quant_q8_1.ok() {
                return Err(missing("ffn_q8_1", "quantize_act_q8_1"));
            }
            if !k.q2_mmq.ok() {
                return Err(missing("ffn_q2", "q2_0_mmq_gemm"));
            }
            let xq = self.quantize_q8_1(ctx, x, m, h, w[0].kp)?;
            let q2 = k.q2_mmq;
            self.mmq_q8_1_launch(ctx, q2, xq, m, w[0].blocks, i, w[0].kp, g, i)?;
            self.mmq_q8_1_launch(ctx, q2, xq, m, w[1].blocks, i, w[1].kp, u, i)?;
            self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
            let aq = self.quantize_q8_1(ctx, g.view(0, (m * i * 4) as u64), m, i, w[2].kp)?;
            self.mmq_q8_1_launch(ctx, q2, aq, m, w[2].blocks, h, w[2].kp, out, h)?;
            return Ok(out.view(0, (m * h * 4) as u64));
        }
        if !k.q2_dequant.ok() {
            return Err(missing("ffn_q2", "dequant_q2_0_gn_to_bf16"));
        }
        let scratch = ctx.arena.q2_dequant_scratch;
        let project = |l: &Self,
                       c: &mut ForwardContext,
                       w: &Q2Weight,
                       xf: DevicePtr,
                       xb: DevicePtr,
                       y: DevicePtr,
                       ldy: usize|
         -> GpuResult<()> {
            let cfg = LaunchCfg::grid((w.n * w.kp / 128 * 32).div_ceil(256), 1, 256);
            let a = |v: usize| KArg::I32(v as i32);
            let dq = scratch.view(0, (w.n * w.kp * 2) as u64);
            l.launch(
                c,
                l.kernels.q2_dequant,
                cfg,
                &[KArg::Ptr(w.blocks), a(w.n), a(w.kp), KArg::Ptr(dq)],
            )?;
            let bw = Bf16Weight {
                weight: dq,
                n: w.n,
                k: w.k,
                kp: w.kp,
            };
            l.bf16_gemm_any(c, xf, xb, &bw, m, y, ldy)
        };
        let xb = self.to_bf16(ctx, x, m * h)?;
        project(self, ctx, &w[0], x, xb, g, i)?;
        project(self, ctx, &w[1], x, xb, u, i)?;
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        let ab = self.to_bf16(ctx, act, m * i)?;
        project(self, ctx, &w[2], act, ab, out, h)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// One MMQ projection over q8_1 activation blocks (`q2_0_mmq_gemm`, `q4k_mmq_gemm`: the
    /// int8 tensor-core tile of kernels/common.cuh, arguments `(xq, m, w, y, n, kp, ldy)`).
    #[allow(clippy::too_many_arguments)]
    fn mmq_q8_1_launch(
        &self,
        ctx: &mut ForwardContext,
        kernel: KernelHandle,
        xq: DevicePtr,
        m: usize,
        w: DevicePtr,
        n: usize,
        kp: usize,
        y: DevicePtr,
        ldy: usize,
    ) -> GpuResult<()> {
        let a = |v: usize| KArg::I32(v as i32);
        let cfg = LaunchCfg::mmq_tile(m, n);
        let args = [
            KArg::Ptr(xq),
            a(m),
            KArg::Ptr(w),
            KArg::Ptr(y),
            a(n),
            a(kp),
            a(ldy),
        ];
        self.launch(ctx, kernel, cfg, &args)
    }

    /// The Q4_K MMQ prefill (`METRALE_FFN_MMQ=1` with the copies built or given): activations
    /// to q8_1 blocks once for gate and up, the Q4_K dot-product GEMMs, act-mul, then down
    /// through the int8 GEMM after `requant_a_bf16_int8` (or q8_1 + Q4_K GEMM).
    fn q4k_mmq_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
    ) -> GpuResult<DevicePtr> {
        let q = self.weights.q4k.unwrap();
        let k = self.kernels;
        if !k.q4k_gemm.ok() {
            return Err(missing("ffn_q4k", "q4k_mmq_gemm"));
        }
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (
            ctx.arena.expert_gate_out,
            ctx.arena.expert_up_out,
            ctx.arena.moe_output,
        );
        let xq = self.quantize_q8_1(ctx, x, m, h, q.kp_gate)?;
        let qk = k.q4k_gemm;
        self.mmq_q8_1_launch(ctx, qk, xq, m, q.gate, i, q.kp_gate, g, i)?;
        self.mmq_q8_1_launch(ctx, qk, xq, m, q.up, i, q.kp_gate, u, i)?;
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        match q.down {
            Q4kDown::Int8 { codes, scales } => {
                if !k.requant_int8.ok() {
                    return Err(missing("ffn_q4k", "requant_a_bf16_int8"));
                }
                if !k.int8_gemm.ok() {
                    return Err(missing("ffn_q4k", "int8_gemm_faith2"));
                }
                let kp = q.kp_down;
                let aq = ctx.arena.act_fp8.view(0, (m * kp) as u64);
                let sa = ctx.arena.act_scale.view(0, (m * 4) as u64);
                let a = |v: usize| KArg::I32(v as i32);
                let cfg = LaunchCfg::grid(m, 1, 256);
                let args = [
                    KArg::Ptr(act),
                    a(m),
                    a(i),
                    a(kp),
                    KArg::Ptr(aq),
                    KArg::Ptr(sa),
                ];
                self.launch(ctx, k.requant_int8, cfg, &args)?;
                let cfg = LaunchCfg::mmq_tile(m, h);
                let args = [
                    KArg::Ptr(aq),
                    KArg::Ptr(sa),
                    a(m),
                    KArg::Ptr(codes),
                    KArg::Ptr(scales),
                    KArg::Ptr(out),
                    a(h),
                    a(kp),
                    a(h),
                ];
                self.launch(ctx, k.int8_gemm, cfg, &args)?;
            }
            Q4kDown::Q4k(dw) => {
                let aq = self.quantize_q8_1(ctx, act, m, i, q.kp_down)?;
                self.mmq_q8_1_launch(ctx, qk, aq, m, dw, h, q.kp_down, out, h)?;
            }
        }
        self.apply_lora_down(ctx, act, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    /// The GPU check's view of the W4A4 gate projection: quantize `m` rows of `x` and run
    /// `nvfp4_proj_mx` over the gate weight into `y` (`[m, inter]`); returns the quantized
    /// activations (codes, scales, globals) in the arena.
    #[doc(hidden)]
    pub fn w4a4_gate_for_check(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        y: DevicePtr,
    ) -> GpuResult<(DevicePtr, DevicePtr, DevicePtr)> {
        let w = self
            .weights
            .nvfp4
            .ok_or_else(|| GpuError::Invalid("w4a4_gate_for_check: no NVFP4 weights".into()))?;
        let q = self.quantize_nvfp4(ctx, x, m, self.hidden, w[0].kp)?;
        self.w4a4_project(ctx, q, m, &w[0], y, self.inter)?;
        Ok(q)
    }

    /// The W4A4 arm: NVFP4 activations into gate and up (one quantization shared), act-mul,
    /// NVFP4 activations into down. Every row is quantized and reduced on its own, in the same
    /// order at every m.
    fn w4a4_arm(&self, ctx: &mut ForwardContext, x: DevicePtr, m: usize) -> GpuResult<DevicePtr> {
        let w = self.weights.nvfp4.unwrap();
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (
            ctx.arena.expert_gate_out,
            ctx.arena.expert_up_out,
            ctx.arena.moe_output,
        );
        let q = self.quantize_nvfp4(ctx, x, m, h, w[0].kp)?;
        self.w4a4_project(ctx, q, m, &w[0], g, i)?;
        self.w4a4_project(ctx, q, m, &w[1], u, i)?;
        self.apply_lora_gate_up(ctx, x, m, g, u)?;
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let act = g.view(0, (m * i * 4) as u64);
        let q = self.quantize_nvfp4(ctx, act, m, i, w[2].kp)?;
        self.w4a4_project(ctx, q, m, &w[2], out, h)?;
        self.apply_lora_down(ctx, act, m, out)?;
        Ok(out.view(0, (m * h * 4) as u64))
    }

    pub(crate) fn to_bf16(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        count: usize,
    ) -> GpuResult<DevicePtr> {
        if !self.kernels.to_bf16.ok() {
            return Err(missing("ffn_act", "f32_to_bf16"));
        }
        let dst = ctx.arena.act_bf16.view(0, (count * 2) as u64);
        let cfg = LaunchCfg::grid(count.div_ceil(256), 1, 256);
        self.launch(
            ctx,
            self.kernels.to_bf16,
            cfg,
            &[KArg::Ptr(x), KArg::Ptr(dst), KArg::I32(count as i32)],
        )?;
        Ok(dst)
    }

    fn bf16_prefill_arm(
        &self,
        ctx: &mut ForwardContext,
        x: DevicePtr,
        m: usize,
        w: &[Bf16Weight; 3],
    ) -> GpuResult<DevicePtr> {
        let (h, i) = (self.hidden, self.inter);
        let (g, u, out) = (
            ctx.arena.expert_gate_out,
            ctx.arena.expert_up_out,
            ctx.arena.moe_output,
        );
        let xb = self.to_bf16(ctx, x, m * h)?;
        let st = ctx.stream;
        let blas = ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: xb,
                w: w[0].weight,
                y: g,
                m,
                n: i,
                k: h,
                kw: w[0].kp,
            },
            st,
        );
        if let Err(GpuError::MissingKernel { .. }) = blas {
            // No BLAS: the GEMV serves narrow batches, nothing else can.
            if m <= 4 && self.kernels.bf16_gemv.ok() {
                return self.bf16_gemv_arm(ctx, x, m, w);
            }
            return Err(missing("cublas", "gemm_bf16"));
        }
        blas?;
        ctx.trace.push("cublas_gemm_bf16");
        ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: xb,
                w: w[1].weight,
                y: u,
                m,
                n: i,
                k: h,
                kw: w[1].kp,
            },
            st,
        )?;
        ctx.trace.push("cublas_gemm_bf16");
        self.act_mul(ctx, g, u, g, m, i, i, i, i)?;
        let gb = self.to_bf16(ctx, g, m * i)?;
        ctx.backend.gemm_bf16(
            &GemmBf16 {
                x: gb,
                w: w[2].weight,
                y: out,
                m,
                n: h,
                k: i,
                kw: w[2].kp,
            },
            st,
        )?;
        ctx.trace.push("cublas_gemm_bf16");
        Ok(out.view(0, (m * h * 4) as u64))
    }
}

fn check_fp8(w: &Fp8Weight, what: &str) -> GpuResult<()> {
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
    if w.weight.bytes < (w.np * w.kp) as u64 || w.scale.bytes < (w.np / 128 * w.kp / 128 * 4) as u64
    {
        return Err(GpuError::Invalid(format!(
            "{what}: buffers too small for [{}, {}]",
            w.np, w.kp
        )));
    }
    Ok(())
}
pub mod testing;
