//! The `ggml` rows of `gpu-check`'s kernel section (`check::kernels`): the engine's GEMV on
//! every engine type (this crate's quantizers' output for Q4_0, Q4_K and Q8_0, random blocks
//! for the others), against its twin bit for bit (the activations quantized by
//! `quantize_act_q8_1`, split by `quantize_act_q8_1s` for `ggml_gemv1`, whose twins are
//! bit-identical too).

use crate::GgmlType;
use crate::check::Row;
use crate::check::kernels::*;
use crate::gpu::reference;
use crate::gpu::sizes::*;
use crate::gpu::{DevicePtr, GpuResult, alloc_upload, download_f32};
use crate::testing::*;

/// The second projection's output scale (llama.cpp's per-tensor `.scale`): not 1, so the rows
/// check the factor, too.
const SECOND_SCALE: f32 = -0.375;

/// `ggml_gemv` for every engine type whose blocks the rows hold whole, each as the first of two
/// projections in one launch beside the same weights as Q8_0: Q4_0, Q4_K and Q8_0 (this
/// crate's quantizers) on each row count, the other types (random blocks) on one row and on
/// a launch's most; `ggml_gemv_sa` on the same rows, `ggml_gemv_split` on those up to
/// `GGML_GEMV_SPLIT_M`, `ggml_gemv_split4` on those from two to `GGML_GEMV_SPLIT4_M` and `ggml_gemv1` on one, every type; and each type's dequantization.
pub(crate) fn ggml_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    let kk = c.kk;
    if !k.is_multiple_of(32) {
        return Ok(());
    }
    let nb = k / Q8_1_ELEMS;
    let xq = b.alloc((GGML_GEMV_MAX_M * nb * Q8_1_BYTES) as u64)?;
    let y2 = b.alloc((GGML_GEMV_MAX_M * n * 4) as u64)?;
    let second = ggml_blocks(&c.wf, GgmlType::Q8_0);
    let w2 = alloc_upload(b, &second)?;
    let quantized = [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_0];
    let mut r = Rand(61);
    for ty in crate::converters::layouts::ggml::TYPES
        .into_iter()
        .filter(|t| k.is_multiple_of(t.block_elems() as usize))
    {
        let ours = quantized.contains(&ty);
        let blocks = if ours {
            ggml_blocks(&c.wf, ty)
        } else {
            ggml_random_blocks(&mut r, ty, n, k)
        };
        let w = alloc_upload(b, &blocks)?;
        let ms = within(c.ms, &kk.ggml_gemv, GGML_GEMV_MAX_M);
        let ms: Vec<usize> = if ours {
            ms
        } else {
            [1, GGML_GEMV_MAX_M]
                .into_iter()
                .filter(|m| ms.contains(m))
                .collect()
        };
        // The shared-activation form (the layer's from 2 rows) on the same rows, the one-row
        // form (the layer's) on one.
        let runs = ms.iter().map(|&m| ("ggml_gemv", kk.ggml_gemv, m));
        let runs = runs
            .chain(ms.iter().map(|&m| ("ggml_gemv_sa", kk.ggml_gemv_sa, m)))
            .chain(
                ms.iter()
                    .filter(|&&m| m <= GGML_GEMV_SPLIT_M)
                    .map(|&m| ("ggml_gemv_split", kk.ggml_gemv_split, m)),
            )
            .chain(
                ms.iter()
                    .filter(|&&m| m > 1 && m <= GGML_GEMV_SPLIT4_M)
                    .map(|&m| ("ggml_gemv_split4", kk.ggml_gemv_split4, m)),
            )
            .chain(ms.contains(&1).then_some(("ggml_gemv1", kk.ggml_gemv1, 1)));
        for (name, gemv, m) in runs.collect::<Vec<_>>() {
            c.poison_y()?;
            b.fill(y2, 0xA5)?;
            // `ggml_gemv1` and `ggml_gemv_split` read the blocks split (`quantize_act_q8_1s`):
            // the same sums.
            let quant = if super::host::SPLIT_FORMS.contains(&name) {
                kk.quant_q8_1s
            } else {
                kk.quant_q8_1
            };
            let q = quant.call().ptr("x", c.xd).dim("m", m).dim("k", k);
            c.launch(q.dim("kp", k).ptr("out", xq))?;
            let call = gemv.call().ptr("xq", xq).dim("m", m).ptr("w", w);
            let call = call.dim("ty", ty as u32 as usize).float("sc", 1.0);
            let call = call.ptr("y", c.yd).ptr("w2", w2);
            let call = call
                .dim("ty2", GgmlType::Q8_0 as u32 as usize)
                .float("sc2", SECOND_SCALE);
            let call = call.ptr("y2", y2).dim("projs", 2).dim("n", n);
            c.launch(call.dim("kp", k).dim("ldy", n))?;
            b.synchronize(0)?;
            let got = download_f32(b, c.yd.view(0, (m * n * 4) as u64))?;
            let got2 = download_f32(b, y2.view(0, (m * n * 4) as u64))?;
            let exact = (0..m).all(|r| {
                let aq = reference::quantize_row_q8_1_act(c.xr(r), k);
                [
                    (&blocks, ty, 1.0, &got),
                    (&second, GgmlType::Q8_0, SECOND_SCALE, &got2),
                ]
                .iter()
                .all(|(wb, t, sc, g)| {
                    let mut want = vec![0f32; n];
                    reference::ggml_gemv_row(&aq, wb, *t, *sc, [n, k], &mut want);
                    want.iter()
                        .zip(&g[r * n..(r + 1) * n])
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                })
            });
            c.bits(rows, &format!("{name} {} + Q8_0", ty.name()), m, exact);
        }
        dequant_row(c, &blocks, w, ty, rows)?;
        b.free(w);
    }
    for p in [xq, y2, w2] {
        b.free(p);
    }
    Ok(())
}

/// The prefill's dequantization (`ggml_dequant_bf16`) of weight `w` (its bytes `blocks`, type
/// `ty`) with an output scale that is not 1, against its twin bit for bit.
fn dequant_row(
    c: &Case,
    blocks: &[u8],
    w: DevicePtr,
    ty: GgmlType,
    rows: &mut Vec<Row>,
) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    let out = b.alloc((n * k * 2) as u64)?;
    b.fill(out, 0xA5)?;
    let call =
        c.kk.ggml_dequant
            .call()
            .ptr("w", w)
            .dim("ty", ty as u32 as usize);
    let call = call.float("sc", SECOND_SCALE).dim("n", n).dim("kp", k);
    c.launch(call.ptr("out", out))?;
    b.synchronize(0)?;
    let mut got = vec![0u8; n * k * 2];
    b.download(out, &mut got)?;
    b.free(out);
    let want = reference::ggml_dequant_bf16(blocks, ty, SECOND_SCALE, n, k);
    let exact = got
        .chunks_exact(2)
        .zip(&want)
        .all(|(g, &v)| u16::from_le_bytes([g[0], g[1]]) == v);
    c.bits(rows, &format!("ggml_dequant_bf16 {}", ty.name()), 0, exact);
    Ok(())
}

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[("ggml", |c, r, _| ggml_rows(c, r))];
