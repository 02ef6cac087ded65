//! The layer's kernel table: every kernel the arms launch, resolved by name once.

use crate::gpu::{GpuBackend, GpuError, KernelHandle};

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
        pub(crate) fn name_of(h: KernelHandle, k: &FfnKernels) -> &'static str {
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
    q2_gemv = "ffn_q2g128"::"q2g128_gemv";
    q2_gemv_m = "ffn_q2g128"::"q2g128_gemv_batchm";
    q2_dequant = "ffn_q2g128"::"q2g128_dequant_bf16";
    q2_mmq = "ffn_q2g128"::"q2g128_mmq_gemm";
    quant_q8_1 = "ffn_q8_1"::"quantize_act_q8_1";
    q4k_encode = "ffn_q4k_mmq"::"nvfp4_to_q4k";
    q4k_int8_encode = "ffn_q4k_mmq"::"nvfp4_to_int8_rows";
    q4k_gemm = "ffn_q4k_mmq"::"q4k_mmq_gemm";
    int8_gemm = "ffn_q4k_mmq"::"q4k_mmq_int8_down_gemm";
    requant_int8 = "ffn_q4k_mmq"::"requant_a_bf16_int8";
    lora_a = "ffn_lora"::"lora_a";
    lora_b = "ffn_lora"::"lora_b_add";
    nvfp4_small_m4 = "ffn_nvfp4"::"nvfp4_proj_small_m4";
    nvfp4_small_m8 = "ffn_nvfp4"::"nvfp4_proj_small_m8";
    nvfp4_small_m16 = "ffn_nvfp4"::"nvfp4_proj_small_m16";
    nvfp4_proj_mx = "ffn_nvfp4"::"nvfp4_proj_mx";
    nvfp4_repack = "ffn_nvfp4"::"nvfp4_mmq_repack";
}

/// A declared activation format that means NVFP4 activations.
pub(crate) fn declared_a4(f: &str) -> bool {
    matches!(f, "w4a4" | "a4" | "nvfp4")
}

pub(crate) fn missing(module: &str, name: &str) -> GpuError {
    GpuError::MissingKernel {
        module: module.into(),
        name: name.into(),
    }
}
