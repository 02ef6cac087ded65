//! What must be read together with a weight, or the weight is refused: a safetensors weight's
//! quantization companions (`X.weight_scale`, `X.qzeros`, ...) that no scheme this reader
//! knows consumes; and a GGUF FFN weight's per-tensor output scale (`blk.N.ffn_X.scale`, read
//! with its weight: `FfnWeight::GgufScaled`) that is not one finite F32 value.

use super::*;
use crate::error::Result;

/// Suffixes of the tensors that are part of a quantized weight: none may be left unread.
const COMPANIONS: [&str; 20] = [
    ".qweight",
    ".qzeros",
    ".scales",
    ".g_idx",
    ".weight_scale",
    ".weight_zero_point",
    ".weight_packed",
    ".weight_shape",
    ".weight_g_idx",
    ".weight_global_scale",
    ".weight_scale_2",
    ".weight_scale_inv",
    ".SCB",
    ".weight_format",
    ".weight.absmax",
    ".weight.quant_map",
    ".weight.nested_absmax",
    ".weight.nested_quant_map",
    ".weight.quant_state.bitsandbytes__nf4",
    ".weight.quant_state.bitsandbytes__fp4",
];

impl Model {
    /// Refuse a weight companion (`X.weight_scale`, `X.weight_zero_point`, ...) that no scheme
    /// this tool reads consumes together with its weight: reading `X.weight` without it would
    /// silently give wrong values (the raw codes), so the model is refused, naming it.
    pub(super) fn check_companions(&self) -> Result<()> {
        for (i, t) in self.tensors.iter().enumerate() {
            let Some((prefix, suffix)) = COMPANIONS
                .iter()
                .find_map(|s| t.name.strip_suffix(s).map(|p| (p, *s)))
            else {
                continue;
            };
            // `scales`, `qzeros` and `g_idx` are legacy packing's only beside a `qweight`.
            if matches!(suffix, ".qzeros" | ".scales" | ".g_idx")
                && self.index_of(&format!("{prefix}.qweight")).is_none()
            {
                continue;
            }
            let consumed = self
                .classify(prefix)
                .is_some_and(|w| !matches!(w, FfnWeight::Plain { .. }) && w.tensors().contains(&i));
            if !consumed {
                let why = if suffix == ".weight_g_idx" {
                    "act-order group indices (weight_g_idx, GPTQ desc_act) are not read yet"
                        .to_string()
                } else if matches!(suffix, ".qweight" | ".qzeros" | ".scales" | ".g_idx") {
                    format!(
                        "legacy qweight/qzeros/scales packing is read for AutoAWQ's GEMM layout (quant_method \"awq\") and GPTQ's (quant_method \"gptq\", in config.json's quantization_config or quantize_config.json); this checkpoint declares quant_method {:?}",
                        self.quant.method.as_deref().unwrap_or("(none)")
                    )
                } else {
                    format!(
                        "no weight scheme this tool reads consumes it with {prefix}.weight (compressed-tensors int/FP8/NVFP4, ModelOpt, block FP8 are read); refused rather than reading the weight without it"
                    )
                };
                return Err(self.qerr(i, why));
            }
        }
        Ok(())
    }

    /// Check every GGUF dense FFN weight's per-tensor output scale (`blk.N.ffn_up.scale`,
    /// which llama.cpp's `build_ffn` multiplies the projection's output by; NVFP4 files carry
    /// ModelOpt's second-level scale there) when the model is opened: one finite F32 value,
    /// else the model is refused, naming the scale tensor.
    pub(super) fn check_gguf_scales(&self) -> Result<()> {
        for l in &self.ffn_layers {
            for w in [&l.gate, &l.up, &l.down] {
                if let FfnWeight::GgufScaled { scale, .. } = *w {
                    self.gguf_scale(scale)?;
                }
            }
        }
        Ok(())
    }
}
