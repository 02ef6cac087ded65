//! Helpers of the `DenseFfnLayer` host-backend tests (tests/ffn_host*.rs): the layer's shape,
//! a context on the host backend, inputs, the float64 reference run, trace counts.
#![allow(dead_code)]

use metrale_pack::converters::layouts;
use metrale_pack::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::{DevicePtr, GpuError, ModelLevers, download_f32, upload_f32};
use metrale_pack::testing::*;
use std::collections::HashMap;
use std::sync::Arc;

pub const H: usize = 192; // not a multiple of 128: FP8 pads K
pub const I: usize = 320; // nor this: FP8 pads N

pub fn levers(pairs: &[(&str, &str)]) -> ModelLevers {
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    ModelLevers::from_map(&env, metrale_pack::gpu::levers::HARDWARE_SM90)
}

/// A context for the layer tests, tracing the kernels it launches.
pub fn ctx(b: HostBackend, lev: ModelLevers) -> ForwardContext {
    let mut c = ForwardContext::new(
        Arc::new(b),
        FfnConfig {
            hidden: H,
            inter: I,
        },
        128,
        lev,
    )
    .unwrap();
    c.tracing = true;
    c
}

pub fn input(c: &ForwardContext, r: &mut Rand, m: usize) -> (DevicePtr, Vec<f32>) {
    let x = r.vec(m * H, 1.0);
    let p = c.backend.alloc((m * H * 4) as u64).unwrap();
    upload_f32(c.backend.as_ref(), p, &x).unwrap();
    (p, x)
}

pub fn fp8_decoded(w: &DenseWeights) -> DenseWeights {
    decoded(w, |x, n, k| {
        let e = layouts::fp8::encode(x, n, k);
        layouts::crop(
            &layouts::fp8::decode_padded(&e.parts[0].1, &e.parts[1].1, e.padded[0], e.padded[1]),
            e.padded[1],
            n,
            k,
        )
    })
}

pub fn run(
    c: &mut ForwardContext,
    layer: &DenseFfnLayer,
    method: &str,
    x: DevicePtr,
    m: usize,
) -> Result<Vec<f32>, GpuError> {
    c.trace.clear();
    poison(c.backend.as_ref(), c.arena.output).unwrap();
    let out = match method {
        "forward" => layer.forward(c, x),
        "k2" => layer.forward_k2(c, x),
        "k3" => layer.forward_k3(c, x),
        "km" => layer.forward_km(c, x, m),
        "prefill" => layer.forward_prefill(c, x, m),
        "batched" => layer.forward_batched(c, x, m),
        "fixed" => layer.forward_fixed(c, x, m),
        _ => unreachable!(),
    }?;
    assert_eq!(out.bytes, (m * H * 4) as u64);
    let y = download_f32(c.backend.as_ref(), out).unwrap();
    assert!(
        y.iter().all(|v| v.is_finite()),
        "{method} m={m}: unwritten (NaN) outputs"
    );
    Ok(y)
}

pub fn count(trace: &[&str], name: &str) -> usize {
    trace.iter().filter(|t| **t == name).count()
}

/// Layer `l` of a loaded model on the first `rows` rows of `x` (uploaded at `input`), against
/// the float64 FFN of `dw` with `act`: the relative error.
pub fn loaded_layer_err(
    lm: &mut metrale_pack::loader::LoadedModel,
    l: usize,
    (input, x): (DevicePtr, &[f32]),
    rows: usize,
    dw: &DenseWeights,
    act: metrale_pack::model::Activation,
) -> f64 {
    let y = lm.forward(l, input, rows).unwrap();
    let y = y.view(0, (rows * dw.hidden * 4) as u64);
    let y = download_f32(lm.ctx.backend.as_ref(), y).unwrap();
    rel_err(&y, &ffn_f64(&x[..rows * dw.hidden], rows, dw, act))
}
