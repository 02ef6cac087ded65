//! The test-data helpers of the `lora` layout (`testing`, mounted there and re-exported):
//! random weights installed in its overlay, and the weights as it holds them.

use crate::converters::layouts::{self, Encoded};
use crate::ffn::{DenseFfnLayer, LoraWeight};
use crate::gpu::{GpuBackend, GpuResult, alloc_upload};
use crate::testing::*;

/// A random LoRA adapter for gate, up and down (the `lora` layout's bytes, BF16 A and B).
pub struct LoraAdapter {
    /// Encoded per projection: parts `a`, `b`; scalars `scaling`, `rank`.
    pub enc: [Encoded; 3],
    pub rank: usize,
    pub scaling: f32,
}

/// Random f32 LoRA matrices (A `[rank, k]`, B `[n, rank]`) for gate, up and down.
pub(super) type LoraMatrices = [(Vec<f32>, Vec<f32>); 3];

pub(super) fn random_lora(r: &mut Rand, hidden: usize, inter: usize, rank: usize) -> LoraMatrices {
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
