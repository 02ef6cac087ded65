//! Test and check helpers, outside the documented API: random weights in each overlay's pack
//! layout, uploaded to a backend, a float64 reference of the whole FFN (the host tests and
//! `gpu-check` share them), and the model generator (`gen_model`) that benchmarks and tests use.
//! They install overlays only through `DenseFfnLayer`'s validating `set_*` methods.

pub mod gen_model;

/// Re-exports every built-in layout's helpers (`src/layouts/TAG/testing.rs`), generated from
/// the list of built-in layouts (`layouts::builtin_layouts!`).
macro_rules! helpers {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        $(pub use crate::layouts::$t::testing::*;)*
    };
}
crate::layouts::builtin_layouts!(helpers);

use crate::gpu::reference::ActRound;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult};
use crate::model::Activation;

/// SplitMix64-based generator of weight-like data.
pub struct Rand(pub u64);

impl Rand {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-a, a).
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a)
            .collect()
    }
}

/// The three projections of a random layer as f32 (gate, up `[inter, hidden]`, down `[hidden, inter]`).
pub struct DenseWeights {
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub down: Vec<f32>,
    pub hidden: usize,
    pub inter: usize,
}

impl DenseWeights {
    pub fn random(r: &mut Rand, hidden: usize, inter: usize) -> Self {
        let a = 1.0 / (hidden as f32).sqrt();
        let b = 1.0 / (inter as f32).sqrt();
        DenseWeights {
            gate: r.vec(inter * hidden, a),
            up: r.vec(inter * hidden, a),
            down: r.vec(hidden * inter, b),
            hidden,
            inter,
        }
    }
}

/// The FFN in float64 on the given (already decoded) weights: `down(act(gate x) * up x)`.
pub fn ffn_f64(x: &[f32], m: usize, w: &DenseWeights, act: Activation) -> Vec<f64> {
    ffn_f64_with(x, m, w, act, ActRound::None)
}

/// [`ffn_f64`] with each projection's input rounded as a kernel of that contract rounds it:
/// `x` before gate and up, the f32 `act(gate) * up` before down (`ActRound::Bf16`: the W4A16
/// decode GEMVs and the tensor-core GEMMs).
pub fn ffn_f64_with(
    x: &[f32],
    m: usize,
    w: &DenseWeights,
    act: Activation,
    round: ActRound,
) -> Vec<f64> {
    ffn_f64_parts(x, m, w, None, act, round)
}

/// [`ffn_f64_with`] plus, in each projection, `extra` (same shapes) times the unrounded input:
/// a base kernel that rounds its input next to a LoRA product over the f32 input.
pub fn ffn_f64_parts(
    x: &[f32],
    m: usize,
    w: &DenseWeights,
    extra: Option<&DenseWeights>,
    act: Activation,
    round: ActRound,
) -> Vec<f64> {
    let (h, i) = (w.hidden, w.inter);
    // sum_t base[t] * rounded[t] + extra[t] * raw[t]
    let dot = |base: &[f32], more: Option<&[f32]>, rounded: &[f64], raw: &[f64]| -> f64 {
        (0..raw.len())
            .map(|t| base[t] as f64 * rounded[t] + more.map_or(0.0, |e| e[t] as f64 * raw[t]))
            .sum()
    };
    let mut out = vec![0f64; m * h];
    for r in 0..m {
        let raw: Vec<f64> = x[r * h..(r + 1) * h].iter().map(|&v| v as f64).collect();
        let rounded: Vec<f64> = x[r * h..(r + 1) * h]
            .iter()
            .map(|&v| round.apply(v) as f64)
            .collect();
        let (mut hid_raw, mut hid) = (vec![0f64; i], vec![0f64; i]);
        for j in 0..i {
            let g = dot(
                row(&w.gate, j, h),
                extra.map(|e| row(&e.gate, j, h)),
                &rounded,
                &raw,
            );
            let u = dot(
                row(&w.up, j, h),
                extra.map(|e| row(&e.up, j, h)),
                &rounded,
                &raw,
            );
            let a = match act {
                Activation::Silu => g / (1.0 + (-g).exp()),
                Activation::Gelu => {
                    0.5 * g * (1.0 + (0.7978845608 * (g + 0.044715 * g * g * g)).tanh())
                }
            };
            // Unrounded: exact in f64. Rounded: the f32 act-mul output, then the kernel's rounding.
            (hid_raw[j], hid[j]) = match round {
                ActRound::None => (a * u, a * u),
                ActRound::Bf16 => {
                    let v = (a * u) as f32;
                    (v as f64, round.apply(v) as f64)
                }
            };
        }
        for c in 0..h {
            let down = extra.map(|e| row(&e.down, c, i));
            out[r * h + c] = dot(row(&w.down, c, i), down, &hid, &hid_raw);
        }
    }
    out
}

/// Row `j` of a row-major matrix with rows of `k`.
fn row(p: &[f32], j: usize, k: usize) -> &[f32] {
    &p[j * k..(j + 1) * k]
}

/// Round each row of `x` (`[m, k]`) through per-row NVFP4 activation quantization and back
/// (`reference::quantize_row_nvfp4` then decode): the activations a W4A4 arm really uses.
pub fn nvfp4_act_roundtrip(x: &[f32], m: usize, k: usize) -> Vec<f32> {
    use crate::converters::nvfp4_modelopt::decode;
    let kp = k.div_ceil(64) * 64;
    let mut out = Vec::with_capacity(m * k);
    for r in 0..m {
        let (c, s, g) = crate::gpu::reference::quantize_row_nvfp4(&x[r * k..(r + 1) * k], kp);
        let mut row = vec![0f32; kp];
        decode(&c, &s, g, &mut row);
        out.extend_from_slice(&row[..k]);
    }
    out
}

/// The W4A4 FFN in float64 on NVFP4-decoded weights: activations quantized per row to NVFP4
/// before gate/up and again before down, everything else in f64.
pub fn w4a4_ffn_f64(x: &[f32], m: usize, wd: &DenseWeights, act: Activation) -> Vec<f64> {
    let (h, i) = (wd.hidden, wd.inter);
    let xq = nvfp4_act_roundtrip(x, m, h);
    // gate/up with identity down, then quantize the activation, then down.
    let mut hid = vec![0f32; m * i];
    for r in 0..m {
        let xr = &xq[r * h..(r + 1) * h];
        for j in 0..i {
            let g: f64 = (0..h)
                .map(|t| wd.gate[j * h + t] as f64 * xr[t] as f64)
                .sum();
            let u: f64 = (0..h).map(|t| wd.up[j * h + t] as f64 * xr[t] as f64).sum();
            let a = match act {
                Activation::Silu => g / (1.0 + (-g).exp()),
                Activation::Gelu => {
                    0.5 * g * (1.0 + (0.7978845608 * (g + 0.044715 * g * g * g)).tanh())
                }
            };
            hid[r * i + j] = (a * u) as f32;
        }
    }
    let hq = nvfp4_act_roundtrip(&hid, m, i);
    let mut out = vec![0f64; m * h];
    for r in 0..m {
        for c in 0..h {
            out[r * h + c] = (0..i)
                .map(|t| wd.down[c * i + t] as f64 * hq[r * i + t] as f64)
                .sum();
        }
    }
    out
}

/// Decode a layout's encoding of each projection back to f32 (the weights the arm really uses).
pub fn decoded(w: &DenseWeights, f: impl Fn(&[f32], usize, usize) -> Vec<f32>) -> DenseWeights {
    let (h, i) = (w.hidden, w.inter);
    DenseWeights {
        gate: f(&w.gate, i, h),
        up: f(&w.up, i, h),
        down: f(&w.down, h, i),
        hidden: h,
        inter: i,
    }
}

/// ‖a − b‖ / ‖b‖.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let (mut n, mut d) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        n += (*x as f64 - y).powi(2);
        d += y * y;
    }
    (n / d.max(1e-300)).sqrt()
}

/// Fill a buffer with NaN (0xFF bytes) so unwritten outputs are visible.
pub fn poison(b: &dyn GpuBackend, p: DevicePtr) -> GpuResult<()> {
    b.fill(p, 0xFF)
}

/// Each value rounded to BF16 (nearest even) and back: what a dequantize-to-BF16 kernel feeds
/// the BF16 GEMM.
pub(crate) fn bf16_rounded(v: Vec<f32>) -> Vec<f32> {
    use crate::converters::bf16;
    v.into_iter()
        .map(|a| bf16::to_f32(bf16::from_f32(a)))
        .collect()
}
