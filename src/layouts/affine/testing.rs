//! Test sources and installs for the `affine` layout: the source kinds its checks and tests
//! imitate, a round-to-nearest integer encoder, AutoAWQ packing of it, and the overlay's install.

use crate::converters::layouts::{self, Encoded};
use crate::ffn::{AffineWeight, DenseFfnLayer};
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, alloc_upload};
use crate::layouts::affine::groups::{AffineGroups, Form, IntSource};
use crate::testing::*;

/// Which source an `affine` test weight imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AffineKind {
    /// 8-bit groups of 32, offset form: ggml's Q8_0 rule (what `convert` does for a float source).
    Q8_0,
    /// 4-bit groups of 32, offset form: ggml's Q4_1 rule (as a Q4_1 GGUF carries it).
    Q4_1,
    /// 4-bit asymmetric groups of 128 (one a row where 128 does not divide k), half scales: the
    /// zero form, as an AWQ or GPTQ-style int4 checkpoint carries.
    Int4G128,
    /// 8-bit asymmetric, one group a row, f32 scales: the f32 zero form (a compressed-tensors
    /// per-channel int8 checkpoint saved in f32).
    Int8Channel,
    /// [`AffineKind::Int4G128`] with act-order: each group's columns scattered over the row
    /// ([`act_order`]), stored sorted by group with the permutation (GPTQ's `desc_act`).
    Int4G128Perm,
}

impl AffineKind {
    /// Every kind.
    pub const ALL: [AffineKind; 5] = [
        AffineKind::Q8_0,
        AffineKind::Q4_1,
        AffineKind::Int4G128,
        AffineKind::Int8Channel,
        AffineKind::Int4G128Perm,
    ];

    /// Its name in check rows and bench lines.
    pub fn name(self) -> &'static str {
        match self {
            AffineKind::Q8_0 => "q8 g32",
            AffineKind::Q4_1 => "q4 g32",
            AffineKind::Int4G128 => "int4 g128 zero",
            AffineKind::Int8Channel => "int8 channel zero f32",
            AffineKind::Int4G128Perm => "int4 g128 act-order",
        }
    }
}

/// A test act-order: the source column of each stored column, a fixed shuffle of `0..k` (the
/// columns sorted by a multiplicative hash).
pub fn act_order(k: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..k as u32).collect();
    p.sort_by_key(|&c| (c.wrapping_mul(2_654_435_761), c));
    p
}

/// A source's integer weight in its own terms, as a checkpoint stores it: codes `[n, k]` and
/// zero points `[n, groups]` below `2^bits`, scales `[n, groups]`.
struct RtnSource {
    codes: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<u32>,
}

/// Round-to-nearest asymmetric integer groups of f32 `[n, k]` at `bits` in groups of `group`:
/// per group `s = (max - min) / (2^bits - 1)` (a half with `half`), `z = round(-min / s)` and
/// `q = round(x / s) + z`, both clamped to the codes (a test encoder: the sources' own
/// quantizers, GPTQ's and AWQ's, search their scales; the carried form is the same).
fn rtn_source(x: &[f32], n: usize, k: usize, bits: u32, group: usize, half: bool) -> RtnSource {
    let top = ((1u32 << bits) - 1) as f32;
    let (mut codes, mut scales, mut zeros) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..n {
        for g in 0..k / group {
            let v = &x[r * k + g * group..r * k + (g + 1) * group];
            let lo = v.iter().fold(0f32, |a, &b| a.min(b));
            let hi = v.iter().fold(0f32, |a, &b| a.max(b));
            let mut s = if hi > lo { (hi - lo) / top } else { 1.0 };
            if half {
                s = half::f16::from_f32(s).to_f32();
            }
            let z = (-lo / s).round().clamp(0.0, top);
            codes.extend(
                v.iter()
                    .map(|&a| ((a / s).round() + z).clamp(0.0, top) as u8),
            );
            scales.push(s);
            zeros.push(z as u32);
        }
    }
    RtnSource {
        codes,
        scales,
        zeros,
    }
}

impl RtnSource {
    /// The groups `convert` carries from it ([`AffineGroups::from_int`]).
    fn groups(&self, bits: u32, group: usize, [n, k]: [usize; 2]) -> AffineGroups {
        let src = IntSource {
            bits,
            group,
            rows: n,
            cols: k,
            codes: &self.codes,
            scales: &self.scales,
            zeros: &self.zeros,
        };
        AffineGroups::from_int(&src).expect("finite test weights")
    }

    /// The scales as a checkpoint stores them: F16 bytes `[groups, n]` (one row a group).
    fn f16_by_group(&self, n: usize, groups: usize) -> Vec<u8> {
        (0..groups * n)
            .flat_map(|i| half::f16::from_f32(self.scales[(i % n) * groups + i / n]).to_le_bytes())
            .collect()
    }
}

/// [`rtn_source`]'s groups as `convert` carries them.
pub fn int_groups_rtn(
    x: &[f32],
    n: usize,
    k: usize,
    bits: u32,
    group: usize,
    half: bool,
) -> AffineGroups {
    rtn_source(x, n, k, bits, group, half).groups(bits, group, [n, k])
}

/// f32 `[n, k]` (n % 8 == 0) as an AutoAWQ GEMM checkpoint holds it: round-to-nearest 4-bit
/// groups of `group` ([`int_groups_rtn`], half scales) packed as `qweight`, `qzeros` and F16
/// `scales [k / group, n]` bytes, with the groups themselves (what `convert` carries).
pub fn awq_tensors(x: &[f32], n: usize, k: usize, group: usize) -> ([Vec<u8>; 3], AffineGroups) {
    let src = rtn_source(x, n, k, 4, group, true);
    let groups = k / group;
    let (qweight, qzeros) = crate::converters::awq::pack(&src.codes, &src.zeros, n, k, groups);
    let scales = src.f16_by_group(n, groups);
    ([qweight, qzeros, scales], src.groups(4, group, [n, k]))
}

/// f32 `[n, k]` (n a multiple of 32 / bits) as a GPTQ checkpoint holds it in group order:
/// round-to-nearest groups of `group` at `bits` (2, 4 or 8; [`int_groups_rtn`], half scales)
/// packed as `qweight`, `qzeros` (v1: each zero point minus one) and F16 `scales
/// [k / group, n]` bytes, with the groups themselves (what `convert` carries: 2-bit codes moved
/// to the middle of 4 bits). Panics on a zero point of 0, which v1 cannot store (random test
/// weights have none).
pub fn gptq_tensors(
    x: &[f32],
    n: usize,
    k: usize,
    bits: u32,
    group: usize,
) -> ([Vec<u8>; 3], AffineGroups) {
    let src = rtn_source(x, n, k, bits, group, true);
    let groups = k / group;
    assert!(src.zeros.iter().all(|&z| z > 0), "a zero point of 0");
    let (qweight, qzeros) =
        crate::converters::gptq::pack(&src.codes, &src.zeros, bits, [n, k], groups);
    let scales = src.f16_by_group(n, groups);
    ([qweight, qzeros, scales], src.groups(bits, group, [n, k]))
}

/// The `affine` layout's encoding of f32 `[n, k]` as `kind`.
pub fn affine_encoded(x: &[f32], n: usize, k: usize, kind: AffineKind) -> Encoded {
    let k32 = k.div_ceil(32) * 32;
    match kind {
        AffineKind::Q8_0 => layouts::affine::encode(x, n, k).expect("finite test weights"),
        AffineKind::Q4_1 => {
            let padded = layouts::pad(x, n, k, n, k32);
            let raw = crate::converters::encode_to_vec::<crate::converters::q4_1::Q4_1>(&padded);
            layouts::affine::carry(crate::GgmlType::Q4_1, &raw, n, k32)
                .expect("finite test weights")
        }
        AffineKind::Int4G128 => {
            let group = if k.is_multiple_of(128) { 128 } else { k };
            layouts::affine::from_groups(&int_groups_rtn(x, n, k, 4, group, true))
        }
        AffineKind::Int8Channel => {
            layouts::affine::from_groups(&int_groups_rtn(x, n, k, 8, k, false))
        }
        AffineKind::Int4G128Perm => {
            let group = if k.is_multiple_of(128) { 128 } else { k };
            let perm = act_order(k);
            let sorted: Vec<f32> = (0..n * k)
                .map(|i| x[i / k * k + perm[i % k] as usize])
                .collect();
            let mut g = int_groups_rtn(&sorted, n, k, 4, group, true);
            g.perm = Some(perm);
            layouts::affine::from_groups(&g)
        }
    }
}

/// An encoded `affine` blob's column permutation and its inverse (its `perm` scalar 1),
/// `[2 kp]`.
pub fn affine_perm(e: &Encoded) -> Option<Vec<u32>> {
    e.scalars.iter().find(|(s, v)| *s == "perm" && *v == 1.0)?;
    let sc = affine_scheme(e);
    let [n, kp] = e.padded;
    let pairs = sc.scales_bytes(n as u64, kp as u64)? as usize;
    Some(layouts::affine::perm_of(&e.parts[1].1, pairs, kp))
}

/// An encoded `affine` blob's scheme (its scalars `bits`, `group`, `form`).
pub fn affine_scheme(e: &Encoded) -> layouts::affine::Scheme {
    let get = |name: &str| {
        e.scalars
            .iter()
            .find(|(s, _)| *s == name)
            .map_or(0.0, |s| s.1)
    };
    layouts::affine::Scheme {
        bits: get("bits") as u32,
        group: get("group") as usize,
        form: Form::from_number(get("form") as u32).expect("an encoder's form"),
    }
}

/// Install the `affine` overlay encoded from the f32 weights ([`affine_encoded`]).
pub fn install_affine(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
    kind: AffineKind,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize| -> GpuResult<AffineWeight> {
        let e = affine_encoded(x, n, k, kind);
        let sc = affine_scheme(&e);
        let kp = e.padded[1];
        let pairs = sc.scales_bytes(n as u64, kp as u64).expect("small") as usize;
        let scales = alloc_upload(b, &e.parts[1].1)?;
        let perm = match affine_perm(&e) {
            Some(_) => scales.view(pairs as u64, 8 * kp as u64),
            None => DevicePtr::NULL,
        };
        let codes = alloc_upload(b, &e.parts[0].1)?;
        AffineWeight::new(codes, scales.view(0, pairs as u64), n, k, kp, sc, perm)
    };
    let (g, mut u, d) = (up(&w.gate, i, h)?, up(&w.up, i, h)?, up(&w.down, h, i)?);
    if !g.perm.is_null() {
        // The same act-order for gate and up (both of k = hidden): one buffer, as a pack's
        // install shares it.
        u.perm = g.perm;
    }
    layer.set_affine_weights(g, u, d)
}

/// The weights as the `affine` layout holds them ([`affine_encoded`]); with `bf16`, each value
/// then rounded to BF16 (what `affine_dequant_bf16` feeds the BF16 GEMM).
pub fn affine_decoded(w: &DenseWeights, kind: AffineKind, bf16: bool) -> DenseWeights {
    decoded(w, |x, n, k| {
        let e = affine_encoded(x, n, k, kind);
        let v = layouts::affine::decode(
            &e.parts[0].1,
            &e.parts[1].1,
            affine_scheme(&e),
            [n, k],
            e.padded[1],
        );
        let v = match affine_perm(&e) {
            Some(p) => layouts::affine::unpermute(&v, [n, k], &p),
            None => v,
        };
        if bf16 { bf16_rounded(v) } else { v }
    })
}
