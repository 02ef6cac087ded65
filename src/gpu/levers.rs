//! Levers: the engine's environment switches for the dense FFN, read once into a value, over
//! per-architecture defaults from `kernels/<arch>/HARDWARE.toml`.

use std::collections::HashMap;

/// The sm_90 defaults, compiled in.
pub const HARDWARE_SM90: &str = include_str!("../../kernels/sm_90/HARDWARE.toml");

/// Where no hardware file or environment says otherwise, the rows from which the FP8 arm runs
/// W8A8 (lever `fp8_w8a8`, `fp8_w8a8_min_rows`): above the decode GEMVs' and the m16 GEMM's
/// caps (32).
pub const FP8_W8A8_MIN_ROWS: usize = 33;

/// Every lever the dense FFN consults.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelLevers {
    /// `METRALE_FFN_BATCH16=1`: FP8 5..=32 rows through the batch-16 GEMV.
    pub ffn_batch16: bool,
    /// `METRALE_FFN_SMALLM` (default on; `0` turns the small-m `_t` GEMMs off).
    pub ffn_small_m: bool,
    /// `METRALE_DECODE_FFN_VIA_GEMM=1`: decode through the prefill GEMM.
    pub decode_ffn_via_gemm: bool,
    /// `METRALE_FFN_M16_TC` over HARDWARE.toml `ffn_m16_tc`.
    pub ffn_m16_tc: bool,
    /// HARDWARE.toml `w8a8_max_rows` (`METRALE_W8A8_MAX_ROWS`).
    pub w8a8_max_rows: usize,
    /// `METRALE_W8A8_DECODE_GEMV` over HARDWARE.toml `w8a8_decode_gemv`: the W8A8 arm's m <= 16
    /// projections through `w8a8_gemv` (the GEMM's bits, more warps).
    pub w8a8_decode_gemv: bool,
    /// `METRALE_W8A8_WGMMA` over HARDWARE.toml `w8a8_wgmma`: the W8A8 arm's projections (every
    /// m) through the sm_90a `w8a8_wgmma` GEMM where the device built it.
    pub w8a8_wgmma: bool,
    /// `METRALE_FP8_W8A8` over HARDWARE.toml `fp8_w8a8`: the FP8 (block-scaled weight) arm's
    /// projections from `fp8_w8a8_min_rows` rows on, with per-group FP8 activations, through the
    /// sm_90a `fp8_wgmma` GEMM where the device built it (formats.md, "FP8 weights with FP8
    /// activations").
    pub fp8_w8a8: bool,
    /// `METRALE_FP8_W8A8_MIN_ROWS` over HARDWARE.toml `fp8_w8a8_min_rows` (default
    /// `FP8_W8A8_MIN_ROWS`, 33): the fewest rows `fp8_w8a8` serves.
    pub fp8_w8a8_min_rows: usize,
    /// `METRALE_DQ_WGMMA` over HARDWARE.toml `dq_wgmma`: the NVFP4 MMQ and Q4_K prefills through
    /// the sm_90a dequantizing wgmma GEMMs (`nvfp4_wgmma`, `q4k_wgmma`, and `int8_wgmma` for the
    /// Q4_K arm's int8 down) where the device built them.
    pub dq_wgmma: bool,
    /// `METRALE_DQ_WGMMA_MIN_ROWS` over HARDWARE.toml `dq_wgmma_min_rows`: the fewest rows they
    /// serve.
    pub dq_wgmma_min_rows: usize,
    /// The FP8 projections of `fp8_gemv_mma_min_rows` to 8 rows on the bf16 tensor-core GEMV
    /// `w8a16_gemv_mma` (bf16-rounded activations) instead of the f32 FFMA GEMVs:
    /// `METRALE_FP8_GEMV_MMA` over HARDWARE.toml `fp8_gemv_mma`.
    pub fp8_gemv_mma: bool,
    /// `METRALE_FP8_GEMV_MMA_MIN_ROWS` over HARDWARE.toml `fp8_gemv_mma_min_rows` (default 1).
    pub fp8_gemv_mma_min_rows: usize,
    /// `METRALE_FFN_GATEUP_FUSED` over HARDWARE.toml `ffn_gateup_fused`.
    pub ffn_gateup_fused: bool,
    /// `METRALE_Q4K_MMQ=1` (old name `METRALE_FFN_MMQ`): build the `q4k_mmq` arm at load.
    pub q4k_mmq: bool,
    /// `METRALE_Q4K_MMQ_DOWN_Q4K=1` (old name `METRALE_FFN_MMQ_DOWN_Q4K`): Q4_K down instead of
    /// int8.
    pub q4k_mmq_down_q4k: bool,
    /// `METRALE_NO_FFN_NVFP4_MMQ=1`.
    pub no_ffn_nvfp4_mmq: bool,
    /// `METRALE_NO_FFN_NVFP4_MMQ_DOWN=1`.
    pub no_ffn_nvfp4_mmq_down: bool,
    /// `METRALE_LORA_NO_FFN=1`.
    pub lora_no_ffn: bool,
    /// `METRALE_Q2G128_MMQ=1` (old name `METRALE_GGUF_NATIVE_Q2_MMQ`): the `q2g128` prefill
    /// through the q8_1 MMQ GEMM.
    pub q2g128_mmq: bool,
    /// `METRALE_SMALL_BATCH_W4A4=1`.
    pub small_batch_w4a4: bool,
    /// `METRALE_SINGLE_ROW_W4A4=1`.
    pub single_row_w4a4: bool,
    /// `METRALE_ACTIVATION_QUANTIZATION` (`w8a8`, `w4a4`, or unset): the fixed path's format.
    pub activation_quantization: Option<String>,
    /// `METRALE_FFN_SILU_FUSED_DOWN=1`: NVFP4 decode forms `silu(gate) * up` inside the down
    /// GEMV instead of the split act-mul + down GEMV (the default).
    pub ffn_silu_fused_down: bool,
    /// HARDWARE.toml `w4a16_k64_min_k` (`METRALE_W4A16_K64_MIN_K`): the smallest k the small-m
    /// `w4a16_gemm_t_k64` serves.
    pub w4a16_k64_min_k: usize,
    /// HARDWARE.toml `w4a16_gemv_ksplit_min_k` (`METRALE_W4A16_GEMV_KSPLIT_MIN_K`): the down
    /// GEMV splits k over a block's warps from this k up; 0 = never.
    pub w4a16_gemv_ksplit_min_k: usize,
    /// `METRALE_AFFINE_FUSED_ACT=1` over HARDWARE.toml `affine_fused_act` (off): the affine
    /// decode of one row quantizes the down input inside the gate and up launch
    /// (`affine{4,8}_gemv_act`) instead of in `affine_quantize_act` after it.
    pub affine_fused_act: bool,
    /// `METRALE_GGML_SPLIT_MAX_ROWS` over HARDWARE.toml `ggml_split_max_rows` (default 2): the
    /// most rows (at most 4) the block-format engine's gate and up GEMV takes in its
    /// split-activation forms (`ggml_gemv1`, `ggml_gemv_split`, then `ggml_gemv_split4`)
    /// rather than `ggml_gemv_sa`.
    pub ggml_split_max_rows: usize,
    /// `METRALE_GGML_DOWN_SPLIT_MAX_ROWS` over HARDWARE.toml `ggml_down_split_max_rows` (2
    /// without either; sm_90's file: 4): the same for its down projection.
    pub ggml_down_split_max_rows: usize,
}

fn parse_hardware(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

impl ModelLevers {
    /// Read the process environment once, over the sm_90 defaults.
    pub fn from_env() -> Self {
        let env: HashMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("METRALE_"))
            .collect();
        Self::from_map(&env, HARDWARE_SM90)
    }

    /// Levers from an explicit variable map (tests) and a HARDWARE.toml text.
    pub fn from_map(env: &HashMap<String, String>, hardware: &str) -> Self {
        let hw = parse_hardware(hardware);
        let flag = |k: &str| {
            env.get(k)
                .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
        };
        let flag_or = |k: &str, hw_key: &str, default: bool| match env.get(k) {
            Some(v) => v == "1" || v.eq_ignore_ascii_case("true"),
            None => hw.get(hw_key).map(|v| v == "true").unwrap_or(default),
        };
        let num_or = |k: &str, hw_key: &str, default: usize| {
            env.get(k)
                .or_else(|| hw.get(hw_key))
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        ModelLevers {
            ffn_batch16: flag("METRALE_FFN_BATCH16"),
            ffn_small_m: env.get("METRALE_FFN_SMALLM").is_none_or(|v| v != "0"),
            decode_ffn_via_gemm: flag("METRALE_DECODE_FFN_VIA_GEMM"),
            ffn_m16_tc: flag_or("METRALE_FFN_M16_TC", "ffn_m16_tc", false),
            w8a8_max_rows: num_or("METRALE_W8A8_MAX_ROWS", "w8a8_max_rows", 64),
            w8a8_decode_gemv: flag_or("METRALE_W8A8_DECODE_GEMV", "w8a8_decode_gemv", false),
            w8a8_wgmma: flag_or("METRALE_W8A8_WGMMA", "w8a8_wgmma", false),
            fp8_w8a8: flag_or("METRALE_FP8_W8A8", "fp8_w8a8", false),
            fp8_w8a8_min_rows: num_or(
                "METRALE_FP8_W8A8_MIN_ROWS",
                "fp8_w8a8_min_rows",
                FP8_W8A8_MIN_ROWS,
            ),
            dq_wgmma: flag_or("METRALE_DQ_WGMMA", "dq_wgmma", false),
            dq_wgmma_min_rows: num_or("METRALE_DQ_WGMMA_MIN_ROWS", "dq_wgmma_min_rows", 1),
            fp8_gemv_mma: flag_or("METRALE_FP8_GEMV_MMA", "fp8_gemv_mma", false),
            fp8_gemv_mma_min_rows: num_or(
                "METRALE_FP8_GEMV_MMA_MIN_ROWS",
                "fp8_gemv_mma_min_rows",
                1,
            ),
            ffn_gateup_fused: flag_or("METRALE_FFN_GATEUP_FUSED", "ffn_gateup_fused", true),
            q4k_mmq: flag("METRALE_Q4K_MMQ") || flag("METRALE_FFN_MMQ"),
            q4k_mmq_down_q4k: flag("METRALE_Q4K_MMQ_DOWN_Q4K") || flag("METRALE_FFN_MMQ_DOWN_Q4K"),
            no_ffn_nvfp4_mmq: flag("METRALE_NO_FFN_NVFP4_MMQ"),
            no_ffn_nvfp4_mmq_down: flag("METRALE_NO_FFN_NVFP4_MMQ_DOWN"),
            lora_no_ffn: flag("METRALE_LORA_NO_FFN"),
            q2g128_mmq: flag("METRALE_Q2G128_MMQ") || flag("METRALE_GGUF_NATIVE_Q2_MMQ"),
            small_batch_w4a4: flag("METRALE_SMALL_BATCH_W4A4"),
            single_row_w4a4: flag("METRALE_SINGLE_ROW_W4A4"),
            activation_quantization: env.get("METRALE_ACTIVATION_QUANTIZATION").cloned(),
            ffn_silu_fused_down: flag("METRALE_FFN_SILU_FUSED_DOWN"),
            w4a16_k64_min_k: num_or("METRALE_W4A16_K64_MIN_K", "w4a16_k64_min_k", 2048),
            w4a16_gemv_ksplit_min_k: num_or(
                "METRALE_W4A16_GEMV_KSPLIT_MIN_K",
                "w4a16_gemv_ksplit_min_k",
                0,
            ),
            affine_fused_act: flag_or("METRALE_AFFINE_FUSED_ACT", "affine_fused_act", false),
            ggml_split_max_rows: num_or("METRALE_GGML_SPLIT_MAX_ROWS", "ggml_split_max_rows", 2),
            ggml_down_split_max_rows: num_or(
                "METRALE_GGML_DOWN_SPLIT_MAX_ROWS",
                "ggml_down_split_max_rows",
                2,
            ),
        }
    }
}

impl Default for ModelLevers {
    fn default() -> Self {
        Self::from_map(&HashMap::new(), HARDWARE_SM90)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_lever_names_keep_working() {
        let on = |k: &str| {
            let env = HashMap::from([(k.to_string(), "1".to_string())]);
            ModelLevers::from_map(&env, HARDWARE_SM90)
        };
        for k in ["METRALE_Q4K_MMQ", "METRALE_FFN_MMQ"] {
            assert!(on(k).q4k_mmq, "{k}");
        }
        for k in ["METRALE_Q4K_MMQ_DOWN_Q4K", "METRALE_FFN_MMQ_DOWN_Q4K"] {
            assert!(on(k).q4k_mmq_down_q4k, "{k}");
        }
        for k in ["METRALE_Q2G128_MMQ", "METRALE_GGUF_NATIVE_Q2_MMQ"] {
            assert!(on(k).q2g128_mmq, "{k}");
        }
        let none = ModelLevers::from_map(&HashMap::new(), HARDWARE_SM90);
        assert!(!none.q4k_mmq && !none.q4k_mmq_down_q4k && !none.q2g128_mmq);
    }

    #[test]
    fn hardware_defaults_and_env_overrides() {
        let d = ModelLevers::default();
        assert!(!d.ffn_m16_tc && d.ffn_small_m && d.ffn_gateup_fused && !d.ffn_batch16);
        assert!(!d.w8a8_decode_gemv);
        assert!(
            d.w8a8_wgmma,
            "kernels/sm_90/HARDWARE.toml turns the wgmma GEMM on"
        );
        assert_eq!(d.w8a8_max_rows, 64);
        assert!(
            d.dq_wgmma,
            "kernels/sm_90/HARDWARE.toml turns the dequantizing wgmma GEMMs on"
        );
        assert!(
            d.fp8_w8a8,
            "kernels/sm_90/HARDWARE.toml turns the FP8 W8A8 prefill on"
        );
        assert_eq!(
            d.fp8_w8a8_min_rows, 5,
            "HARDWARE.toml: FP8 W8A8 from 5 rows"
        );
        assert!(
            d.fp8_gemv_mma && d.fp8_gemv_mma_min_rows == 2,
            "HARDWARE.toml: the FP8 tensor-core GEMV from 2 rows"
        );
        assert!(!ModelLevers::from_map(&HashMap::new(), "").fp8_gemv_mma);
        assert_eq!(
            ModelLevers::from_map(&HashMap::new(), "").fp8_w8a8_min_rows,
            FP8_W8A8_MIN_ROWS
        );
        let env: HashMap<String, String> = [
            ("METRALE_FFN_M16_TC", "1"),
            ("METRALE_FFN_SMALLM", "0"),
            ("METRALE_W8A8_MAX_ROWS", "8"),
            ("METRALE_W8A8_DECODE_GEMV", "1"),
            ("METRALE_W8A8_WGMMA", "0"),
            ("METRALE_FP8_W8A8", "0"),
            ("METRALE_DQ_WGMMA", "0"),
            ("METRALE_DQ_WGMMA_MIN_ROWS", "65"),
            ("METRALE_FP8_W8A8_MIN_ROWS", "5"),
            ("METRALE_GGML_SPLIT_MAX_ROWS", "4"),
            ("METRALE_GGML_DOWN_SPLIT_MAX_ROWS", "1"),
        ]
        .into_iter()
        .map(|(a, b)| (a.into(), b.into()))
        .collect();
        let l = ModelLevers::from_map(&env, HARDWARE_SM90);
        assert!(l.ffn_m16_tc && !l.ffn_small_m);
        assert_eq!(l.w8a8_max_rows, 8);
        assert!(l.w8a8_decode_gemv && !l.w8a8_wgmma && !l.fp8_w8a8 && !l.dq_wgmma);
        assert_eq!(l.dq_wgmma_min_rows, 65);
        assert_eq!(l.fp8_w8a8_min_rows, 5);
        assert_eq!((d.ggml_split_max_rows, l.ggml_split_max_rows), (2, 4));
        assert_eq!(
            (d.ggml_down_split_max_rows, l.ggml_down_split_max_rows),
            (4, 1),
            "HARDWARE.toml: the down projection's split forms to four rows"
        );
        let hw_on = ModelLevers::from_map(&HashMap::new(), "ffn_m16_tc = true # comment");
        assert!(hw_on.ffn_m16_tc);
    }
}
