//! Installing overlays: the `set_*` validators and the load-time finalizers.

use super::*;

use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuBackend, GpuError, GpuResult, StreamId};
use crate::model::Activation;

impl DenseFfnLayer {
    /// Install the BF16 overlay (`bf16` layout).
    pub fn set_bf16_weights(
        &mut self,
        gate: Bf16Weight,
        up: Bf16Weight,
        down: Bf16Weight,
    ) -> GpuResult<()> {
        self.check_projections("set_bf16_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(key::BF16, [gate, up, down]);
        Ok(())
    }

    /// Install the native block-scaled FP8 overlay (`fp8` layout).
    pub fn set_fp8_weights(
        &mut self,
        gate: Fp8Weight,
        up: Fp8Weight,
        down: Fp8Weight,
    ) -> GpuResult<()> {
        self.check_projections("set_fp8_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(
            key::FP8,
            Fp8Overlay {
                gate,
                up,
                down,
                fused: None,
            },
        );
        Ok(())
    }

    /// Install the fused `[2*inter, hidden]` FP8 gate+up weight whose views the installed gate
    /// and up are (gate = rows `[0, inter)`, up = rows `[interp, interp + inter)`).
    pub fn set_fp8_gate_up_fused(&mut self, fused: Fp8Weight) -> GpuResult<()> {
        let interp = round_up(self.inter, 128);
        let mut ov = self.get(key::FP8).cloned().ok_or_else(|| {
            GpuError::Order("set_fp8_gate_up_fused: install set_fp8_weights first".into())
        })?;
        debug_assert_eq!(
            ov.gate.weight.addr, fused.weight.addr,
            "gate must be a view of the fused weight"
        );
        if ov.gate.weight.addr != fused.weight.addr
            || ov.up.weight.addr != fused.weight.addr + (interp * fused.kp) as u64
        {
            return Err(GpuError::Shape(
                "set_fp8_gate_up_fused: gate and up are not views of the fused weight".into(),
            ));
        }
        if fused.n != 2 * interp || fused.k != self.hidden {
            return Err(GpuError::Shape(format!(
                "set_fp8_gate_up_fused: shape [{}, {}], needs [{}, {}]",
                fused.n,
                fused.k,
                2 * interp,
                self.hidden
            )));
        }
        fused.validate("set_fp8_gate_up_fused")?;
        ov.fused = Some(fused);
        self.overlays.set(key::FP8, ov);
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
            return Err(GpuError::NotServed(
                "set_w8a8_decode_weights: the W8A8 decode arm refuses a GELU FFN".into(),
            ));
        }
        if (hidden, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Shape(format!(
                "set_w8a8_decode_weights: hidden/inter {hidden}/{inter}, layer is {}/{}",
                self.hidden, self.inter
            )));
        }
        self.check_projections(
            "set_w8a8_decode_weights",
            [Some(&w[0]), Some(&w[1]), Some(&w[2])],
        )?;
        self.overlays.set(key::W8A8, w);
        Ok(())
    }

    /// Install the NVFP4 base (`nvfp4` layout: ModelOpt codes and scales, K padded to 64).
    pub fn set_nvfp4_weights(&mut self, w: [Nvfp4Weight; 3]) -> GpuResult<()> {
        self.check_projections("set_nvfp4_weights", [Some(&w[0]), Some(&w[1]), Some(&w[2])])?;
        self.overlays.set(key::NVFP4, w);
        Ok(())
    }

    /// The installed NVFP4 base, which the overlays built from it (`_t` copies, MMQ tiles, Q4_K
    /// copies) need first; `what` names the refusing method.
    fn nvfp4_base(&self, what: &str) -> GpuResult<[Nvfp4Weight; 3]> {
        self.get(key::NVFP4)
            .copied()
            .ok_or_else(|| GpuError::Order(format!("{what}: install the nvfp4 base first")))
    }

    /// Install `nvfp4_mmq` tiles given by a pack (what `finalize_nvfp4_mmq_load` would build),
    /// per projection. Needs the `nvfp4` base first; each buffer must hold the tiles of that
    /// projection's padded shape.
    pub fn set_nvfp4_mmq_tiles(&mut self, tiles: [Option<DevicePtr>; 3]) -> GpuResult<()> {
        let w = self.nvfp4_base("set_nvfp4_mmq_tiles")?;
        for (p, (t, base)) in tiles.iter().zip(w.iter()).enumerate() {
            let np = base.n.div_ceil(NVFP4_MMQ_TILE_N) * NVFP4_MMQ_TILE_N;
            if let Some(t) = t
                && (!base.kp.is_multiple_of(NVFP4_MMQ_TILE_K)
                    || !fits(
                        t.bytes,
                        &[
                            np / NVFP4_MMQ_TILE_N,
                            base.kp / NVFP4_MMQ_TILE_K,
                            NVFP4_MMQ_TILE_BYTES,
                        ],
                    ))
            {
                return Err(GpuError::Shape(format!(
                    "set_nvfp4_mmq_tiles projection {p}: {} bytes do not hold the nvfp4_mmq tiles of [{np}, {}]",
                    t.bytes, base.kp
                )));
            }
        }
        self.overlays.set_slots(key::NVFP4_MMQ, tiles);
        Ok(())
    }

    /// Install the `q4k_mmq` copies given by a pack (what `finalize_q4k_load` would build): gate
    /// and up as Q4_K rows, down as int8 with row scales or as Q4_K. Needs the `nvfp4` base
    /// first (the arm is an NVFP4-layer prefill); every buffer must hold its rows.
    pub fn set_q4k_mmq_weights(&mut self, q: Q4kMmqWeights) -> GpuResult<()> {
        self.nvfp4_base("set_q4k_mmq_weights")?;
        if (q.hidden, q.inter) != (self.hidden, self.inter) {
            return Err(GpuError::Shape(format!(
                "set_q4k_mmq_weights: q4k_mmq copies of a {} x {} layer, this layer is {} x {}",
                q.hidden, q.inter, self.hidden, self.inter
            )));
        }
        q.validate("set_q4k_mmq_weights")?;
        self.overlays.set(key::Q4K_MMQ, q);
        Ok(())
    }

    /// Install the transposed `_t` copies (`nvfp4_t` layout) the `w4a16_gemm_t*` prefill GEMMs
    /// read, per projection (gate, up, down). Needs the `nvfp4` base installed first.
    pub fn set_nvfp4_t_weights(&mut self, t: [Option<Nvfp4TWeight>; 3]) -> GpuResult<()> {
        let w = self.nvfp4_base("set_nvfp4_t_weights")?;
        for (p, (x, base)) in t.iter().zip(w.iter()).enumerate() {
            if let Some(x) = x {
                x.validate(base, &format!("set_nvfp4_t_weights projection {p}"))?;
            }
        }
        self.overlays.set_slots(key::NVFP4_T, t);
        Ok(())
    }

    /// Drop the `_t` copies of the first `count` projections (gate, up, down), freeing those
    /// the layer allocated; views into a loaded pack are only dropped.
    pub(crate) fn drop_t_copies(&mut self, b: &dyn GpuBackend, count: usize) {
        let Some(&t) = self.get(key::NVFP4_T) else {
            return;
        };
        let mut left = t;
        for t in left.iter_mut().take(count) {
            if let Some(t) = t.take()
                && t.owned
            {
                b.free(t.codes);
                b.free(t.scales);
            }
        }
        self.overlays.set_slots(key::NVFP4_T, left);
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
        if self.holds(Layout::Fp8)
            || self.holds(Layout::Q2g128)
            || self.activation == Activation::Gelu
            || !self.kernels.nvfp4_repack.ok()
            || ctx.levers.no_ffn_nvfp4_mmq
        {
            return Ok(false);
        }
        let Some(&w) = self.get(key::NVFP4) else {
            return Ok(false);
        };
        if (h, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Shape(format!(
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
        let mut tiles = self.get(key::NVFP4_MMQ).copied().unwrap_or_default();
        for (p, &x) in w.iter().enumerate().take(count) {
            if tiles[p].is_some() {
                continue;
            }
            let np = round_up(x.n, 128);
            let out = ctx.backend.alloc(
                (np / NVFP4_MMQ_TILE_N * x.kp / NVFP4_MMQ_TILE_K * NVFP4_MMQ_TILE_BYTES) as u64,
            )?;
            self.allocated.push(out);
            let call = self.kernels.nvfp4_repack.call();
            let call = call.ptr("codes", x.codes).ptr("scales", x.scales);
            let l = call
                .dim("n", x.n)
                .dim("np", np)
                .dim("kp", x.kp)
                .ptr("out", out);
            let l = l.finish()?;
            ctx.record(l.spec.name);
            l.run(ctx.backend.as_ref(), stream)?;
            tiles[p] = Some(out);
            did = true;
        }
        self.overlays.set_slots(key::NVFP4_MMQ, tiles);
        if did {
            ctx.backend.synchronize(stream)?;
            self.drop_t_copies(ctx.backend.as_ref(), count);
        }
        Ok(did)
    }

    /// Install a LoRA adapter (`lora` layout) per projection (gate, up, down; any may be absent)
    /// on the NVFP4 base. Refused while an FP8, BF16 or q2g128 overlay is installed, and when
    /// the layer cannot take the split-SiLU decode path (SiLU, `act_mul_silu` and `w4a16_gemv`
    /// resolved), with those words.
    pub fn set_lora_weights(&mut self, w: [Option<LoraWeight>; 3]) -> GpuResult<()> {
        if self.holds(Layout::Fp8) || self.holds(Layout::Bf16) || self.holds(Layout::Q2g128) {
            return Err(GpuError::Order(
                "set_lora_weights: refused while an FP8, BF16 or q2g128 overlay is installed (LoRA applies to the NVFP4 arms only)".into(),
            ));
        }
        if self.activation != Activation::Silu
            || !self.kernels.act_silu.ok()
            || !self.kernels.nvfp4_gemv.ok()
        {
            return Err(GpuError::NotServed(
                "set_lora_weights: refused: the layer cannot take the split-SiLU decode path (needs SiLU, act_mul_silu and w4a16_gemv)".into(),
            ));
        }
        if !self.holds(Layout::Nvfp4) {
            return Err(GpuError::Order(
                "set_lora_weights: install the NVFP4 base first".into(),
            ));
        }
        self.check_projections(
            "set_lora_weights",
            [w[0].as_ref(), w[1].as_ref(), w[2].as_ref()],
        )?;
        self.overlays.set(key::LORA, w);
        Ok(())
    }

    /// Load-time setup of the Q4_K MMQ prefill arm (`METRALE_Q4K_MMQ=1`): builds on the GPU,
    /// from the NVFP4 base, gate and up as Q4_K (byte-identical to the converter's encoder, so to
    /// ggml's reference quantizer) and down as int8 rows (when `q4k_mmq_int8_down_gemm` and
    /// `requant_a_bf16_int8` resolved and `METRALE_Q4K_MMQ_DOWN_Q4K` is unset) or Q4_K;
    /// synchronizes; frees the `_t` copies. Returns at once (false) for q2g128 or FP8 layers,
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
        if self.holds(Layout::Q2g128)
            || self.holds(Layout::Fp8)
            || !(k.q4k_encode.ok()
                && k.q4k_int8_encode.ok()
                && k.q4k_gemm.ok()
                && k.quant_q8_1.ok())
            || !ctx.levers.q4k_mmq
            || self.holds(Layout::Q4kMmq)
        {
            return Ok(false);
        }
        let Some(&w) = self.get(key::NVFP4) else {
            return Ok(false);
        };
        if (h, inter) != (self.hidden, self.inter) {
            return Err(GpuError::Shape(format!(
                "finalize_q4k_load: {h}/{inter}, layer is {}/{}",
                self.hidden, self.inter
            )));
        }
        let (kp_gate, kp_down) = (round_up(h, 256), round_up(inter, 256));
        let b = ctx.backend.clone();
        let encode =
            |ctx: &mut ForwardContext, x: &Nvfp4Weight, kp_q: usize| -> GpuResult<DevicePtr> {
                let out = b.alloc((x.n * kp_q / Q4K_ELEMS * Q4K_BYTES) as u64)?;
                let call = k.q4k_encode.call().ptr("codes", x.codes);
                let call = call.ptr("scales", x.scales).float("g", x.global_scale);
                let call = call.dim("n", x.n).dim("k", x.k).dim("kp_nv", x.kp);
                let l = call.dim("kp_q", kp_q).ptr("out", out).finish()?;
                ctx.record(l.spec.name);
                l.run(b.as_ref(), stream)?;
                Ok(out)
            };
        let gate = encode(ctx, &w[0], kp_gate)?;
        self.allocated.push(gate);
        let up = encode(ctx, &w[1], kp_gate)?;
        self.allocated.push(up);
        let d = &w[2];
        let down = if k.int8_gemm.ok() && k.requant_int8.ok() && !ctx.levers.q4k_mmq_down_q4k {
            let codes = b.alloc((d.n * kp_down) as u64)?;
            self.allocated.push(codes);
            let scales = b.alloc((d.n * 4) as u64)?;
            self.allocated.push(scales);
            let call = k.q4k_int8_encode.call().ptr("codes", d.codes);
            let call = call.ptr("scales", d.scales).float("g", d.global_scale);
            let call = call.dim("n", d.n).dim("k", d.k).dim("kp_nv", d.kp);
            let call = call.dim("kp_q", kp_down).ptr("qc", codes).ptr("qs", scales);
            let l = call.finish()?;
            ctx.record(l.spec.name);
            l.run(b.as_ref(), stream)?;
            Q4kDown::Int8 { codes, scales }
        } else {
            let p = encode(ctx, d, kp_down)?;
            self.allocated.push(p);
            Q4kDown::Q4k(p)
        };
        b.synchronize(stream)?;
        self.drop_t_copies(b.as_ref(), 3);
        self.overlays.set(
            key::Q4K_MMQ,
            Q4kMmqWeights {
                gate,
                up,
                down,
                hidden: h,
                inter,
                kp_gate,
                kp_down,
                owned: true,
            },
        );
        Ok(true)
    }

    /// Install the packed q2g128 overlay (`q2g128` layout). Its arms: decode through
    /// `q2g128_gemv`, 2-3 rows through `forward_km_q2`, prefill (SiLU only) through the Q2 MMQ
    /// GEMM (`METRALE_Q2G128_MMQ=1`) or dequantize-to-BF16 plus the BF16 GEMM.
    pub fn set_q2_weights(
        &mut self,
        gate: Q2g128Weight,
        up: Q2g128Weight,
        down: Q2g128Weight,
    ) -> GpuResult<()> {
        self.check_projections("set_q2_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(key::Q2G128, [gate, up, down]);
        Ok(())
    }
}
