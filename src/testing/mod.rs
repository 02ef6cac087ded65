//! Test and check helpers, outside the documented API: random weights in each overlay's pack
//! layout, uploaded to a backend, a float64 reference of the whole FFN (the host tests and
//! `gpu-check` share them), and the model generator (`gen_model`) that benchmarks and tests use.
//! They install overlays only through `DenseFfnLayer`'s validating `set_*` methods.

mod affine;
pub mod gen_model;
pub use affine::*;

use crate::converters::layouts::{self, Encoded};
use crate::ffn::{
    AffineWeight, Bf16Weight, DenseFfnLayer, Fp8Weight, LoraWeight, Nvfp4TWeight, Nvfp4Weight,
    Q2g128Weight, Q4kDown, Q4kMmqWeights, W8a8Weight,
};
use crate::gpu::reference::ActRound;
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, alloc_upload};
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

fn upload_fp8(b: &dyn GpuBackend, e: &Encoded, n: usize, k: usize) -> GpuResult<Fp8Weight> {
    Ok(Fp8Weight {
        weight: alloc_upload(b, &e.parts[0].1)?,
        scale: alloc_upload(b, &e.parts[1].1)?,
        n,
        k,
        np: e.padded[0],
        kp: e.padded[1],
    })
}

/// Install the FP8 overlay (and, with `fused`, the fused gate+up that gate and up view).
pub fn install_fp8(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
    fused: bool,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let ge = layouts::fp8::encode(&w.gate, i, h);
    let ue = layouts::fp8::encode(&w.up, i, h);
    let down = upload_fp8(b, &layouts::fp8::encode(&w.down, h, i), h, i)?;
    if fused {
        let interp = ge.padded[0];
        let f = layouts::fp8::fuse(ge, ue);
        let fw = upload_fp8(b, &f, 2 * interp, h)?;
        layer.set_fp8_weights(fw.rows(0, i), fw.rows(interp, i), down)?;
        layer.set_fp8_gate_up_fused(fw)
    } else {
        layer.set_fp8_weights(upload_fp8(b, &ge, i, h)?, upload_fp8(b, &ue, i, h)?, down)
    }
}

/// Install the BF16 overlay.
pub fn install_bf16(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize| -> GpuResult<Bf16Weight> {
        let e = layouts::bf16::encode(x, n, k);
        Ok(Bf16Weight {
            weight: alloc_upload(b, &e.parts[0].1)?,
            n,
            k,
            kp: e.padded[1],
        })
    };
    layer.set_bf16_weights(up(&w.gate, i, h)?, up(&w.up, i, h)?, up(&w.down, h, i)?)
}

/// Install the W8A8 decode weights.
pub fn install_w8a8(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize| -> GpuResult<W8a8Weight> {
        let e = layouts::w8a8::encode(x, n, k);
        Ok(W8a8Weight {
            weight: alloc_upload(b, &e.parts[0].1)?,
            scale: alloc_upload(b, &e.parts[1].1)?,
            n,
            k,
            kp: e.padded[1],
        })
    };
    layer.set_w8a8_decode_weights(
        [up(&w.gate, i, h)?, up(&w.up, i, h)?, up(&w.down, h, i)?],
        h,
        i,
    )
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

/// Each projection's `nvfp4` encoding with its `(n, k)`: gate, up, down.
fn nvfp4_encoded(w: &DenseWeights) -> [(Encoded, usize, usize); 3] {
    let (h, i) = (w.hidden, w.inter);
    [(&w.gate, i, h), (&w.up, i, h), (&w.down, h, i)]
        .map(|(x, n, k)| (layouts::nvfp4::encode(x, n, k), n, k))
}

/// Upload `enc` (from [`nvfp4_encoded`]) and install it as the NVFP4 base.
fn install_nvfp4_encoded(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    enc: &[(Encoded, usize, usize); 3],
) -> GpuResult<()> {
    let up = |(e, n, k): &(Encoded, usize, usize)| -> GpuResult<Nvfp4Weight> {
        Ok(Nvfp4Weight {
            codes: alloc_upload(b, &e.parts[0].1)?,
            scales: alloc_upload(b, &e.parts[1].1)?,
            global_scale: e.scalars[0].1,
            n: *n,
            k: *k,
            kp: e.padded[1],
        })
    };
    layer.set_nvfp4_weights([up(&enc[0])?, up(&enc[1])?, up(&enc[2])?])
}

/// Install the NVFP4 base (`nvfp4` layout) encoded from the f32 weights.
pub fn install_nvfp4(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    install_nvfp4_encoded(b, layer, &nvfp4_encoded(w))
}

/// Install the NVFP4 base and its transposed `_t` copies (`nvfp4_t` layout, owned by the layer).
pub fn install_nvfp4_t(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let enc = nvfp4_encoded(w);
    install_nvfp4_encoded(b, layer, &enc)?;
    let t = |(e, n, _): &(Encoded, usize, usize)| -> GpuResult<Option<Nvfp4TWeight>> {
        let t = layouts::nvfp4_t::from_nvfp4(&e.parts[0].1, &e.parts[1].1, 0.0, *n, e.padded[1]);
        Ok(Some(Nvfp4TWeight {
            codes: alloc_upload(b, &t.parts[0].1)?,
            scales: alloc_upload(b, &t.parts[1].1)?,
            np: t.padded[0],
            owned: true,
        }))
    };
    layer.set_nvfp4_t_weights([t(&enc[0])?, t(&enc[1])?, t(&enc[2])?])
}

/// Install the NVFP4 base and the converter's `nvfp4_mmq` tiles (as a pack gives them).
pub fn install_nvfp4_mmq(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let enc = nvfp4_encoded(w);
    install_nvfp4_encoded(b, layer, &enc)?;
    let t = |(e, n, _): &(Encoded, usize, usize)| -> GpuResult<Option<DevicePtr>> {
        let t = layouts::nvfp4_mmq::from_nvfp4(&e.parts[0].1, &e.parts[1].1, 0.0, *n, e.padded[1]);
        Ok(Some(alloc_upload(b, &t.parts[0].1)?))
    };
    layer.set_nvfp4_mmq_tiles([t(&enc[0])?, t(&enc[1])?, t(&enc[2])?])
}

/// The weights as the `nvfp4` layout holds them (encode, then decode).
pub fn nvfp4_decoded(w: &DenseWeights) -> DenseWeights {
    decoded(w, |x, n, k| {
        let e = layouts::nvfp4::encode(x, n, k);
        let kp = e.padded[1];
        layouts::crop(
            &layouts::nvfp4::decode_padded(&e.parts[0].1, &e.parts[1].1, e.scalars[0].1, n, kp),
            kp,
            n,
            k,
        )
    })
}

/// A random LoRA adapter for gate, up and down (the `lora` layout's bytes, BF16 A and B).
pub struct LoraAdapter {
    /// Encoded per projection: parts `a`, `b`; scalars `scaling`, `rank`.
    pub enc: [Encoded; 3],
    pub rank: usize,
    pub scaling: f32,
}

/// Random f32 LoRA matrices (A `[rank, k]`, B `[n, rank]`) for gate, up and down.
type LoraMatrices = [(Vec<f32>, Vec<f32>); 3];

fn random_lora(r: &mut Rand, hidden: usize, inter: usize, rank: usize) -> LoraMatrices {
    let mut one = |n: usize, k: usize| {
        let a = r.vec(rank * k, 1.0 / (k as f32).sqrt());
        let b = r.vec(n * rank, 0.5);
        (a, b)
    };
    [one(inter, hidden), one(inter, hidden), one(hidden, inter)]
}

impl LoraAdapter {
    /// `lora_alpha` of every adapter made here: scaling = alpha / rank.
    const ALPHA: f32 = 2.0;

    fn encode(m: &LoraMatrices, hidden: usize, inter: usize, rank: usize) -> Self {
        let scaling = Self::ALPHA / rank as f32;
        let dims = [(inter, hidden), (inter, hidden), (hidden, inter)];
        LoraAdapter {
            enc: std::array::from_fn(|p| {
                let (n, k) = dims[p];
                layouts::lora::encode(&m[p].0, &m[p].1, n, k, rank, scaling)
            }),
            rank,
            scaling,
        }
    }

    pub fn random(r: &mut Rand, hidden: usize, inter: usize, rank: usize) -> Self {
        Self::encode(&random_lora(r, hidden, inter, rank), hidden, inter, rank)
    }

    /// A random adapter written as a PEFT directory (`adapter_config.json`,
    /// `adapter_model.safetensors` with F32 A and B, the same matrices on each of `layers`
    /// layers) for `convert --lora`; returns what the `lora` layout holds for every layer.
    pub fn write_peft(
        r: &mut Rand,
        dir: &std::path::Path,
        layers: usize,
        hidden: usize,
        inter: usize,
        rank: usize,
    ) -> crate::Result<Self> {
        let io = |err: std::io::Error| crate::Error::Write {
            file: dir.display().to_string(),
            step: "write",
            err,
        };
        let st = |e: safetensors::SafeTensorError| crate::Error::Output {
            file: dir.display().to_string(),
            reason: e.to_string(),
        };
        use safetensors::tensor::{Dtype, TensorView};
        let m = random_lora(r, hidden, inter, rank);
        std::fs::create_dir_all(dir).map_err(io)?;
        std::fs::write(
            dir.join("adapter_config.json"),
            format!(
                r#"{{"r": {rank}, "lora_alpha": {}, "target_modules": ["gate_proj", "up_proj", "down_proj"]}}"#,
                Self::ALPHA
            ),
        )
        .map_err(io)?;
        let dims = [(inter, hidden), (inter, hidden), (hidden, inter)];
        let bytes: Vec<(Vec<u8>, Vec<u8>)> = m
            .iter()
            .map(|(a, b)| {
                (
                    bytemuck::cast_slice(a).to_vec(),
                    bytemuck::cast_slice(b).to_vec(),
                )
            })
            .collect();
        let mut views = Vec::new();
        for l in 0..layers {
            for (p, name) in ["gate", "up", "down"].iter().enumerate() {
                let pre = format!("base_model.model.model.layers.{l}.mlp.{name}_proj");
                let (n, k) = dims[p];
                views.push((
                    format!("{pre}.lora_A.weight"),
                    TensorView::new(Dtype::F32, vec![rank, k], &bytes[p].0).map_err(st)?,
                ));
                views.push((
                    format!("{pre}.lora_B.weight"),
                    TensorView::new(Dtype::F32, vec![n, rank], &bytes[p].1).map_err(st)?,
                ));
            }
        }
        std::fs::write(
            dir.join("adapter_model.safetensors"),
            safetensors::serialize(views, None).map_err(st)?,
        )
        .map_err(io)?;
        Ok(Self::encode(&m, hidden, inter, rank))
    }

    /// Each projection's dense delta `scaling * B @ A` (f64 sums), for a layer of `hidden` x
    /// `inter`.
    pub fn delta(&self, hidden: usize, inter: usize) -> DenseWeights {
        let (h, i) = (hidden, inter);
        let d = |e: &Encoded, n: usize, k: usize| -> Vec<f32> {
            layouts::lora::decode_delta(&e.parts[0].1, &e.parts[1].1, n, k, self.rank, self.scaling)
        };
        DenseWeights {
            gate: d(&self.enc[0], i, h),
            up: d(&self.enc[1], i, h),
            down: d(&self.enc[2], h, i),
            hidden: h,
            inter: i,
        }
    }

    /// `w` plus each projection's dense delta ([`Self::delta`]).
    pub fn applied_to(&self, w: &DenseWeights) -> DenseWeights {
        let d = self.delta(w.hidden, w.inter);
        let add = |base: &[f32], d: &[f32]| -> Vec<f32> {
            base.iter().zip(d).map(|(a, b)| a + b).collect()
        };
        DenseWeights {
            gate: add(&w.gate, &d.gate),
            up: add(&w.up, &d.up),
            down: add(&w.down, &d.down),
            hidden: w.hidden,
            inter: w.inter,
        }
    }

    /// Upload and install through `set_lora_weights`.
    pub fn install(&self, b: &dyn GpuBackend, layer: &mut DenseFfnLayer) -> GpuResult<()> {
        let (h, i) = (layer.hidden, layer.inter);
        let dims = [(i, h), (i, h), (h, i)];
        let mut w = [None; 3];
        for (p, (e, &(n, k))) in self.enc.iter().zip(dims.iter()).enumerate() {
            w[p] = Some(LoraWeight {
                a: alloc_upload(b, &e.parts[0].1)?,
                b: alloc_upload(b, &e.parts[1].1)?,
                n,
                k,
                rank: self.rank,
                scaling: self.scaling,
            });
        }
        layer.set_lora_weights(w)
    }
}

/// Each value rounded to BF16 (nearest even) and back: what a dequantize-to-BF16 kernel feeds
/// the BF16 GEMM.
fn bf16_rounded(v: Vec<f32>) -> Vec<f32> {
    use crate::converters::bf16;
    v.into_iter()
        .map(|a| bf16::to_f32(bf16::from_f32(a)))
        .collect()
}

/// Install the packed q2g128 overlay (`q2g128` layout) encoded from the f32 weights.
pub fn install_q2(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
) -> GpuResult<()> {
    let (h, i) = (w.hidden, w.inter);
    let up = |x: &[f32], n: usize, k: usize| -> GpuResult<Q2g128Weight> {
        let e = layouts::q2g128::encode(x, n, k);
        Ok(Q2g128Weight {
            blocks: alloc_upload(b, &e.parts[0].1)?,
            n,
            k,
            kp: e.padded[1],
        })
    };
    layer.set_q2_weights(up(&w.gate, i, h)?, up(&w.up, i, h)?, up(&w.down, h, i)?)
}

/// The weights as the `q2g128` layout holds them; with `bf16`, each value then rounded to BF16
/// (what `q2g128_dequant_bf16` feeds the BF16 GEMM).
pub fn q2_decoded(w: &DenseWeights, bf16: bool) -> DenseWeights {
    decoded(w, |x, n, k| {
        let e = layouts::q2g128::encode(x, n, k);
        let v = layouts::q2g128::decode(&e.parts[0].1, n, k, e.padded[1]);
        if bf16 { bf16_rounded(v) } else { v }
    })
}

/// Install the NVFP4 base and the converter's `q4k_mmq` copies of its decoded values (as a pack
/// gives them): gate/up Q4_K, down int8 rows (or Q4_K with `down_q4k`).
pub fn install_nvfp4_q4k(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    w: &DenseWeights,
    down_q4k: bool,
) -> GpuResult<()> {
    install_nvfp4(b, layer, w)?;
    install_q4k(b, layer, &nvfp4_decoded(w), down_q4k)
}

/// Install the `q4k_mmq` layout alone (no NVFP4 base), encoded from the values `wd`: gate and
/// up as Q4_K, down as int8 rows (or Q4_K), as a `q4k_mmq`-only pack holds them.
pub fn install_q4k(
    b: &dyn GpuBackend,
    layer: &mut DenseFfnLayer,
    wd: &DenseWeights,
    down_q4k: bool,
) -> GpuResult<()> {
    let (h, i) = (wd.hidden, wd.inter);
    let q = |x: &[f32], n: usize, k: usize| layouts::q4k_mmq::encode_q4k(x, n, k);
    let (ge, ue) = (q(&wd.gate, i, h), q(&wd.up, i, h));
    let down = if down_q4k {
        Q4kDown::Q4k(alloc_upload(b, &q(&wd.down, h, i).parts[0].1)?)
    } else {
        let e = layouts::q4k_mmq::encode_int8(&wd.down, h, i);
        Q4kDown::Int8 {
            codes: alloc_upload(b, &e.parts[0].1)?,
            scales: alloc_upload(b, &e.parts[1].1)?,
        }
    };
    layer.set_q4k_mmq_weights(Q4kMmqWeights::new(
        alloc_upload(b, &ge.parts[0].1)?,
        alloc_upload(b, &ue.parts[0].1)?,
        down,
        (h, i),
        (ge.padded[1], i.div_ceil(256) * 256),
    )?)
}

/// The weights the Q4_K MMQ arm holds: gate/up Q4_K of the NVFP4-decoded values, down int8 rows
/// (or Q4_K).
pub fn q4k_mmq_decoded(w: &DenseWeights, down_q4k: bool) -> DenseWeights {
    let wd = nvfp4_decoded(w);
    let (h, i) = (w.hidden, w.inter);
    let q4k = |x: &[f32], n: usize, k: usize| {
        let e = layouts::q4k_mmq::encode_q4k(x, n, k);
        layouts::q4k_mmq::decode_q4k(&e.parts[0].1, n, k, e.padded[1])
    };
    let down = if down_q4k {
        q4k(&wd.down, h, i)
    } else {
        let e = layouts::q4k_mmq::encode_int8(&wd.down, h, i);
        layouts::q4k_mmq::decode_int8(&e.parts[0].1, &e.parts[1].1, h, i, e.padded[1])
    };
    DenseWeights {
        gate: q4k(&wd.gate, i, h),
        up: q4k(&wd.up, i, h),
        down,
        hidden: h,
        inter: i,
    }
}
