//! `affine`: integer codes (4 or 8 bits) with a scale and an offset or zero point per group,
//! and the affine arms (decode GEMVs; prefill dequantized to BF16 for the BF16 GEMM).

use crate::converters::layouts::Layout;
use crate::ffn::layouts::Runtime;
use crate::ffn::weights::{projection_weight, refuse};
use crate::ffn::*;

use crate::converters::layouts::affine::{self, Scheme};
use crate::gpu::sizes::AFFINE_GROUP;
use crate::gpu::{DevicePtr, GpuResult};
use crate::layouts::affine::groups::{Form, carried_bits};

use crate::ffn::routing::always;

/// The projections' names in refusals, in the order the `finalize_*` calls take them.
const PROJ_NAMES: [&str; 3] = ["gate", "up", "down"];
use Layout::*;
use Method::*;

/// This layout's overlay key (re-exported in `ffn::key`).
pub(crate) mod keys {
    use super::*;
    /// `affine`: gate, up, down.
    pub const AFFINE: Key<[AffineWeight; 3]> = Key::new(Layout::Affine);
}

/// Its entry in the runtime registry.
pub(crate) const RUNTIME: Runtime = Runtime {
    layout: Layout::Affine,
    builds_on: None,
    install,
    arms: &ARMS,
    named: &NAMED,
};

/// The arms a pack-loaded layer holding it offers by name (`loader::arms::arms_of`).
static NAMED: [NamedArm; 1] = [NamedArm::new("affine", &[Layout::Affine], 60)];

/// Install this layer's `affine` overlay from the loader's, if it holds one.
fn install(o: &Overlays, l: &mut DenseFfnLayer) -> GpuResult<()> {
    match o.get(key::AFFINE) {
        Some(&[g, u, d]) => l.set_affine_weights(g, u, d),
        None => Ok(()),
    }
}

pub use crate::gpu::sizes::AFFINE_GEMV_MAX_ROWS;

/// Its rows of the arm table, ranked within each method (`routing::arms`).
#[rustfmt::skip]
static ARMS: [Arm; 3] = [
    Arm::new(Decode, "affine gemv", Affine, always, |l, c, x, m| l.affine_gemv_arm(c, x, m)).rank(25),
    Arm::new(Small, "affine batch", Affine, |_, _, m| m <= AFFINE_GEMV_MAX_ROWS, |l, c, x, m| l.affine_gemv_arm(c, x, m)).rank(15),
    Arm::new(Prefill, "affine", Affine, always, |l, c, x, m| l.affine_prefill_arm(c, x, m)).rank(25),
];

/// Affine integer weight (`affine` layout): codes `[n, kp]` at `bits` (4: two a byte; 8), and
/// per group of `group` values its pair in `form` (`scales`: the half scale then the half
/// offset or zero point, 4 bytes, or the f32 scale then the f32 zero point, 8 bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AffineWeight {
    pub(crate) codes: DevicePtr,
    pub(crate) scales: DevicePtr,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) kp: usize,
    pub(crate) scheme: Scheme,
    /// The source column of each stored column, u32 `[kp]` (act-order groups sorted), then its
    /// inverse, `[kp]` more; or null.
    pub(crate) perm: DevicePtr,
}
projection_weight!(AffineWeight, "A validated affine weight of `[n, k]` stored as `[n, kp]`, its columns in source order or, with `perm` (u32 `[2 kp]`: the permutation and its inverse; else null), sorted by group." {
    codes: DevicePtr,
    scales: DevicePtr,
    n: usize,
    k: usize,
    kp: usize,
    scheme: Scheme,
    perm: DevicePtr
});

impl AffineWeight {
    /// The `affine` layout's rules: 4 or 8 bits, groups of 32 times a power of two dividing
    /// kp (or kp), kp % 128, buffers that hold the codes and the scale pairs.
    pub(crate) fn validate(&self, what: &str) -> GpuResult<()> {
        let w = self;
        let fits_all = affine::codes_bytes(w.n as u64, w.kp as u64, w.scheme.bits)
            .is_some_and(|b| b <= w.codes.bytes)
            && w.scheme
                .scales_bytes(w.n as u64, w.kp as u64)
                .is_some_and(|b| b <= w.scales.bytes);
        let perm_fits = w.perm.is_null() || w.perm.bytes >= 8 * w.kp as u64;
        if !w.scheme.valid(w.kp) || w.kp < w.k || !fits_all || !perm_fits {
            return Err(refuse(
                what,
                format!(
                    "bits {} / group {} / form {:?} / kp {} / {}, {} and {} (permutation) bytes do not fit the affine layout of [{}, {}] (4 or 8 bits, groups of 32 x 2^j dividing kp or kp itself, kp % {}, a permutation of 8 kp bytes or none)",
                    w.scheme.bits,
                    w.scheme.group,
                    w.scheme.form,
                    w.kp,
                    w.codes.bytes,
                    w.scales.bytes,
                    w.perm.bytes,
                    w.n,
                    w.k,
                    affine::K_ALIGN
                ),
            ));
        }
        Ok(())
    }
}

/// One projection's GGUF Q4_0, Q4_1 or Q8_0 blocks `[n, k / 32]` on the device, as the GGUF
/// holds them (the input of [`DenseFfnLayer::finalize_affine_load`]).
#[derive(Clone, Copy, Debug)]
pub struct GgufBlocks {
    /// The blocks.
    pub raw: DevicePtr,
    /// Their type: Q4_0, Q4_1 or Q8_0.
    pub ty: crate::GgmlType,
    /// Rows (outputs).
    pub n: usize,
    /// Values per row (a multiple of 32).
    pub k: usize,
}

/// One projection's AutoAWQ GEMM tensors on the device, as the checkpoint holds them (the input
/// of [`DenseFfnLayer::finalize_affine_awq_load`]): I32 `qweight [k, n / 8]`, I32
/// `qzeros [k / group, n / 8]`, F16 `scales [k / group, n]`.
#[derive(Clone, Copy, Debug)]
pub struct AwqTensors {
    /// `qweight`.
    pub qweight: DevicePtr,
    /// `qzeros`.
    pub qzeros: DevicePtr,
    /// `scales`.
    pub scales: DevicePtr,
    /// Rows (outputs, a multiple of 8).
    pub n: usize,
    /// Values per row.
    pub k: usize,
    /// Values per group (`k / group` groups).
    pub group: usize,
}

/// One projection's GPTQ tensors on the device, as the checkpoint holds them (the input of
/// [`DenseFfnLayer::finalize_affine_gptq_load`]): I32 `qweight [k * bits / 32, n]`, I32
/// `qzeros [k / group, n * bits / 32]` (v1 zero points), F16 `scales [k / group, n]`, and the
/// I32 `g_idx [k]` if the checkpoint has one (checked to be in group order).
#[derive(Clone, Copy, Debug)]
pub struct GptqTensors {
    /// `qweight`.
    pub qweight: DevicePtr,
    /// `qzeros`.
    pub qzeros: DevicePtr,
    /// `scales`.
    pub scales: DevicePtr,
    /// `g_idx`, or `None`.
    pub g_idx: Option<DevicePtr>,
    /// Bits per code: 4 or 8 (2-bit checkpoints go through `convert`).
    pub bits: u32,
    /// Rows (outputs, a multiple of 32 / bits).
    pub n: usize,
    /// Values per row (a multiple of 32 / bits).
    pub k: usize,
    /// Values per group (`k / group` groups; `k` for GPTQ's `group_size: -1`).
    pub group: usize,
}

/// The padded K and the stored scheme of a checkpoint's zero-form carry at `bits` (4 or 8) in
/// groups of `group` over `k` values: the source's group where it divides kp, else kp.
fn zero_form(bits: u32, group: usize, k: usize) -> (usize, Scheme) {
    let kp = crate::converters::layouts::round_up(k, affine::K_ALIGN);
    let own = Scheme {
        bits,
        group,
        form: Form::Zero,
    };
    let scheme = Scheme {
        group: affine::stored_group(own, kp),
        ..own
    };
    (kp, scheme)
}

/// What one projection's GPU carry writes: its shape, padded K and scheme, and the launch that
/// fills its codes and scale pairs (given them and its refusal flag).
struct Carry<'a> {
    n: usize,
    k: usize,
    kp: usize,
    scheme: Scheme,
    call: Box<dyn Fn(DevicePtr, DevicePtr, DevicePtr) -> crate::gpu::table::Call + 'a>,
}

impl DenseFfnLayer {
    /// Build the `affine` overlay on the GPU from the GGUF blocks of gate, up and down
    /// (`affine_from_ggml`): the bytes `convert` writes for them (tested bit for bit against
    /// the converter), so an engine that loads the GGUF itself serves the same arms with the
    /// same weights. Allocates the codes and scale pairs (freed with the layer), synchronizes
    /// `stream`, and installs them. Refuses, naming the projection, a type other than Q4_0,
    /// Q4_1 or Q8_0, a shape that does not fit the blocks, or a block the converter would
    /// refuse (a scale or minimum not finite, an offset -z d that is not an exact half).
    pub fn finalize_affine_load(
        &mut self,
        ctx: &mut ForwardContext,
        blocks: [GgufBlocks; 3],
        stream: crate::gpu::StreamId,
    ) -> GpuResult<()> {
        let what = |p: usize| format!("finalize_affine_load: {}", PROJ_NAMES[p]);
        let k = self.kernels;
        // Every projection's shape first, so nothing is allocated for a call that is refused.
        let mut plans = Vec::with_capacity(3);
        for (p, x) in blocks.iter().enumerate() {
            let bits = carried_bits(x.ty).ok_or_else(|| {
                refuse(
                    &what(p),
                    format!("{} is not Q4_0, Q4_1 or Q8_0", x.ty.name()),
                )
            })?;
            let need = (x.n as u64)
                .checked_mul((x.k / AFFINE_GROUP) as u64)
                .and_then(|v| v.checked_mul(x.ty.block_bytes()));
            if !x.k.is_multiple_of(AFFINE_GROUP) || need.is_none_or(|need| need > x.raw.bytes) {
                return Err(refuse(
                    &what(p),
                    format!(
                        "{} bytes are not [{}, {}] of {} (k % 32)",
                        x.raw.bytes,
                        x.n,
                        x.k,
                        x.ty.name()
                    ),
                ));
            }
            let kp = crate::converters::layouts::round_up(x.k, affine::K_ALIGN);
            let x = *x;
            plans.push(Carry {
                n: x.n,
                k: x.k,
                kp,
                scheme: Scheme::ggml(bits),
                call: Box::new(move |codes, sb, bad| {
                    let call = k
                        .affine_from_ggml
                        .call()
                        .ptr("raw", x.raw)
                        .dim("ty", x.ty as usize);
                    let call = call
                        .dim("n", x.n)
                        .dim("k", x.k)
                        .dim("kp", kp)
                        .ptr("codes", codes);
                    call.ptr("sb", sb).ptr("bad", bad)
                }),
            });
        }
        let refusal = "a block's scale or minimum is not finite, or its offset -z d is not an exact half (convert names the row and block)";
        self.carry_affine(ctx, plans, stream, &what, refusal)
    }

    /// Build the `affine` overlay on the GPU from the AutoAWQ GEMM tensors of gate, up and down
    /// (`affine_from_awq`): the bytes `convert` writes for them (the zero form with half scales,
    /// tested bit for bit against the converter), so an engine that loads the AWQ checkpoint
    /// itself serves the same arms with the same weights. Allocates, synchronizes `stream` and
    /// installs as [`Self::finalize_affine_load`] does. Refuses, naming the projection, a shape
    /// the tensors do not hold, a group the layout does not store (32 x 2^j dividing k, or k),
    /// or a scale that is not finite.
    pub fn finalize_affine_awq_load(
        &mut self,
        ctx: &mut ForwardContext,
        tensors: [AwqTensors; 3],
        stream: crate::gpu::StreamId,
    ) -> GpuResult<()> {
        let what = |p: usize| format!("finalize_affine_awq_load: {}", PROJ_NAMES[p]);
        let k = self.kernels;
        let mut plans = Vec::with_capacity(3);
        for (p, x) in tensors.iter().enumerate() {
            let groups = x.k.checked_div(x.group).unwrap_or(0);
            let words = (x.n / 8) as u64 * 4;
            let fits =
                |b: u64, rows: usize| (rows as u64).checked_mul(words).is_some_and(|w| w <= b);
            let scales_fit = (groups as u64)
                .checked_mul(x.n as u64 * 2)
                .is_some_and(|b| b <= x.scales.bytes);
            if !x.n.is_multiple_of(8)
                || !crate::layouts::affine::groups::group_carried(x.group, x.k)
                || !fits(x.qweight.bytes, x.k)
                || !fits(x.qzeros.bytes, groups)
                || !scales_fit
            {
                return Err(refuse(
                    &what(p),
                    format!(
                        "qweight / qzeros / scales of {} / {} / {} bytes are not AWQ's [{}, {}] in groups of {} (n % 8; groups of 32 x 2^j dividing k, or k)",
                        x.qweight.bytes, x.qzeros.bytes, x.scales.bytes, x.n, x.k, x.group
                    ),
                ));
            }
            let (kp, scheme) = zero_form(4, x.group, x.k);
            let x = *x;
            plans.push(Carry {
                n: x.n,
                k: x.k,
                kp,
                scheme,
                call: Box::new(move |codes, sb, bad| {
                    let call = k.affine_from_awq.call().ptr("qweight", x.qweight);
                    let call = call.ptr("qzeros", x.qzeros).ptr("scales", x.scales);
                    let call = call.dim("n", x.n).dim("k", x.k).dim("kp", kp);
                    let call = call.dim("group", x.group).dim("sgroup", scheme.group);
                    call.ptr("codes", codes).ptr("sb", sb).ptr("bad", bad)
                }),
            });
        }
        self.carry_affine(ctx, plans, stream, &what, "a scale is not finite")
    }

    /// Build the `affine` overlay on the GPU from the GPTQ tensors of gate, up and down
    /// (`affine_from_gptq`): the bytes `convert` writes for them (the zero form with half
    /// scales; tested bit for bit against the converter), as
    /// [`Self::finalize_affine_awq_load`] does for AutoAWQ. Refuses, naming the projection, a
    /// width other than 4 or 8 bits (`convert` carries 2-bit codes), a shape the tensors do not hold, a group the layout does
    /// not store, a scale that is not finite, a zero point stored as all ones, or a `g_idx`
    /// out of group order (act-order, which the layout does not carry).
    pub fn finalize_affine_gptq_load(
        &mut self,
        ctx: &mut ForwardContext,
        tensors: [GptqTensors; 3],
        stream: crate::gpu::StreamId,
    ) -> GpuResult<()> {
        let what = |p: usize| format!("finalize_affine_gptq_load: {}", PROJ_NAMES[p]);
        let k = self.kernels;
        let mut plans = Vec::with_capacity(3);
        for (p, x) in tensors.iter().enumerate() {
            let per = 32 / x.bits.max(1) as usize;
            let groups = x.k.checked_div(x.group).unwrap_or(0) as u64;
            let words = |rows: u64, cols: usize| rows.checked_mul(cols as u64 * 4);
            let holds = |b: Option<u64>, ptr: DevicePtr| b.is_some_and(|b| b <= ptr.bytes);
            // 2-bit codes are moved to the middle of 4 bits by `convert` (AffineGroups::from_int);
            // this carry writes them as stored, so it takes 4 and 8 bits only.
            let fits = matches!(x.bits, 4 | 8)
                && x.n.is_multiple_of(per)
                && x.k.is_multiple_of(per)
                && crate::layouts::affine::groups::group_carried(x.group, x.k)
                && holds(words((x.k / per) as u64, x.n), x.qweight)
                && holds(words(groups, x.n / per), x.qzeros)
                && holds(groups.checked_mul(x.n as u64 * 2), x.scales)
                && x.g_idx.is_none_or(|g| holds(Some(x.k as u64 * 4), g));
            if !fits {
                return Err(refuse(
                    &what(p),
                    format!(
                        "qweight / qzeros / scales of {} / {} / {} bytes are not GPTQ's [{}, {}] at {} bits in groups of {} (4 or 8 bits; n and k multiples of 32 / bits; groups of 32 x 2^j dividing k, or k)",
                        x.qweight.bytes, x.qzeros.bytes, x.scales.bytes, x.n, x.k, x.bits, x.group
                    ),
                ));
            }
            let (kp, scheme) = zero_form(
                crate::layouts::affine::groups::stored_bits(x.bits),
                x.group,
                x.k,
            );
            let x = *x;
            plans.push(Carry {
                n: x.n,
                k: x.k,
                kp,
                scheme,
                call: Box::new(move |codes, sb, bad| {
                    let call = k.affine_from_gptq.call().ptr("qweight", x.qweight);
                    let call = call.ptr("qzeros", x.qzeros).ptr("scales", x.scales);
                    let call = call.ptr("g_idx", x.g_idx.unwrap_or(DevicePtr::NULL));
                    let call = call
                        .dim("bits", x.bits as usize)
                        .dim("n", x.n)
                        .dim("k", x.k);
                    let call = call.dim("kp", kp).dim("group", x.group);
                    let call = call.dim("sgroup", scheme.group).ptr("codes", codes);
                    call.ptr("sb", sb).ptr("bad", bad)
                }),
            });
        }
        let refusal = "a scale is not finite, a zero point is stored as all ones, or g_idx is out of group order (act-order); convert names which";
        self.carry_affine(ctx, plans, stream, &what, refusal)
    }

    /// The GPU carries of gate, up and down on `stream`, each with its refusal flag, one wait,
    /// then the overlay installed; a flagged projection is refused by name with `refusal`.
    fn carry_affine(
        &mut self,
        ctx: &mut ForwardContext,
        plans: Vec<Carry>,
        stream: crate::gpu::StreamId,
        what: &dyn Fn(usize) -> String,
        refusal: &str,
    ) -> GpuResult<()> {
        let b = ctx.backend.clone();
        let bad = b.alloc(12)?;
        let mut out = Vec::with_capacity(3);
        let mut carry_all = || -> GpuResult<[u8; 12]> {
            b.fill(bad, 0)?;
            for (p, c) in plans.iter().enumerate() {
                let sizes = (
                    affine::codes_bytes(c.n as u64, c.kp as u64, c.scheme.bits),
                    c.scheme.scales_bytes(c.n as u64, c.kp as u64),
                );
                let (Some(cb), Some(sbb)) = sizes else {
                    return Err(refuse(&what(p), format!("[{}, {}] overflows", c.n, c.k)));
                };
                let (codes, scales) = (b.alloc(cb)?, b.alloc(sbb)?);
                self.allocated.extend([codes, scales]);
                let l = (c.call)(codes, scales, bad.view(4 * p as u64, 4)).finish()?;
                ctx.record(l.spec.name);
                l.run(b.as_ref(), stream)?;
                let perm = DevicePtr::NULL;
                out.push(AffineWeight::new(
                    codes, scales, c.n, c.k, c.kp, c.scheme, perm,
                )?);
            }
            b.synchronize(stream)?;
            let mut flags = [0u8; 12];
            b.download(bad, &mut flags)?;
            Ok(flags)
        };
        let flags = carry_all();
        b.free(bad);
        if let Some(p) = flags?.chunks_exact(4).position(|f| f != [0; 4]) {
            return Err(refuse(&what(p), refusal.into()));
        }
        self.set_affine_weights(out[0], out[1], out[2])
    }

    /// Install the affine integer overlay (`affine` layout). Its arms: decode and up to
    /// [`AFFINE_GEMV_MAX_ROWS`] rows through the affine GEMVs, prefill dequantized to BF16 (one projection at a time into the
    /// context's scratch) and multiplied by the BF16 GEMM.
    pub fn set_affine_weights(
        &mut self,
        gate: AffineWeight,
        up: AffineWeight,
        down: AffineWeight,
    ) -> GpuResult<()> {
        self.check_projections("set_affine_weights", [Some(&gate), Some(&up), Some(&down)])?;
        self.overlays.set(key::AFFINE, [gate, up, down]);
        Ok(())
    }
}
