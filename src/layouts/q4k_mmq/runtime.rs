//! `q4k_mmq`: Q4_K gate and up, int8 or Q4_K down. On its own it serves every forward kind
//! but the fixed path (decode GEMVs over its bytes, the Q4_K MMQ prefill); beside the `nvfp4`
//! base (given by a pack, or built at load by `finalize_q4k_load`) it is that layer's prefill
//! with `METRALE_Q4K_MMQ=1`, and the NVFP4 arms keep decode.

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{accessors, refuse};
use crate::ffn::*;
use crate::gpu::ModelLevers;

use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuError, GpuResult, StreamId};

use crate::ffn::routing::{always, prefill};
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `q4k_mmq`: the Q4_K MMQ copies.
    pub const Q4K_MMQ: Key<Q4kMmqWeights> = Key::new(Layout::Q4kMmq);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Q4kMmq,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 2] = [
    NamedArm::new("q4k_mmq", &[Layout::Nvfp4, Layout::Q4kMmq], 45).levers(q4k_mmq_lever),
    // q4k_mmq on its own: its decode GEMVs and its MMQ prefill.
    NamedArm::new("q4k", &[Layout::Q4kMmq], 70),
];

/// The levers of the `q4k_mmq` arm beside the NVFP4 base: its MMQ prefill.
fn q4k_mmq_lever() -> ModelLevers {
    ModelLevers {
        q4k_mmq: true,
        ..ModelLevers::default()
    }
}

/// Install this layer's `q4k_mmq` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::Q4K_MMQ) {
        Some(&q) => l.set_q4k_mmq_weights(q),
        None => Ok(()),
    }
}

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 7] = [
    // Ranked after the NVFP4 arms that serve always: a layer with the base decodes as before.
    Arm::new(Decode, "q4k gemv", Q4kMmq, |l, _, _| l.kernels.q4k_gemv.ok() && l.q4k_down_gemv_ok(1), |l, c, x, m| l.q4k_gemv_arm(c, x, m)).rank(100),
    Arm::new(Decode, "q4k via prefill", Q4kMmq, always, prefill).rank(110),
    Arm::new(Small, "q4k gemv", Q4kMmq, |l, _, m| l.kernels.q4k_gemv_m.ok() && l.q4k_down_gemv_ok(m), |l, c, x, m| l.q4k_gemv_arm(c, x, m)).rank(70),
    Arm::new(Small, "q4k via prefill", Q4kMmq, always, prefill).rank(80),
    Arm::new(Verify, "q4k gemv", Q4kMmq, |l, _, m| m <= 4 && l.kernels.q4k_gemv_m.ok() && l.q4k_down_gemv_ok(m), |l, c, x, m| l.q4k_gemv_arm(c, x, m)).rank(60),
    Arm::new(Verify, "q4k via prefill", Q4kMmq, always, prefill).rank(70),
    // Beside the NVFP4 base, with its lever; on its own, always.
    Arm::new(Prefill, "q4k mmq", Q4kMmq, |l, c, _| c.levers.q4k_mmq || !l.holds(Nvfp4), |l, c, x, m| l.q4k_mmq_arm(c, x, m)).rank(50),
];

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

impl DenseFfnLayer {
    /// Install the `q4k_mmq` copies given by a pack (what `finalize_q4k_load` would build): gate
    /// and up as Q4_K rows, down as int8 with row scales or as Q4_K; every buffer must hold its
    /// rows. On its own or beside the `nvfp4` base.
    pub fn set_q4k_mmq_weights(&mut self, q: Q4kMmqWeights) -> GpuResult<()> {
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

    /// Whether the decode GEMV of the installed down projection is resolved for `m` rows
    /// (`int8_rows_gemv` for int8 rows, `q4k_gemv` for Q4_K; their batch-4 forms past one row).
    pub(crate) fn q4k_down_gemv_ok(&self, m: usize) -> bool {
        let k = &self.kernels;
        match self.get(key::Q4K_MMQ).map(|q| q.down) {
            Some(Q4kDown::Int8 { .. }) if m == 1 => k.int8_gemv.ok(),
            Some(Q4kDown::Int8 { .. }) => k.int8_gemv_m.ok(),
            Some(Q4kDown::Q4k(_)) if m == 1 => k.q4k_gemv.ok(),
            Some(Q4kDown::Q4k(_)) => k.q4k_gemv_m.ok(),
            None => false,
        }
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
        self.check_dims("finalize_q4k_load", h, inter)?;
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
}
