//! The q2g128 rows: the GEMVs, the BF16 dequantization, the q8_1 activations and the MMQ GEMM.
//! `gpu-check`'s kernel section (`check::kernels`), moved here unchanged.

use crate::check::kernels::*;
use crate::check::*;
use crate::converters::layouts;
use crate::gpu::reference::{self};
use crate::gpu::sizes::*;
use crate::gpu::{GpuResult, alloc_upload};
use rayon::prelude::*;

/// q2g128: the GEMVs, the BF16 dequantization and the q8_1 activations bit for bit, the MMQ
/// GEMM against the f64 product of the same q8_1 blocks.
pub(crate) fn q2g128_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    let qe = layouts::q2g128::encode(&c.wf, n, k);
    let kp2 = qe.padded[1];
    let qw = alloc_upload(b, &qe.parts[0].1)?;
    let q2ref = |r: usize| {
        let mut out = vec![0f32; n];
        reference::q2_row(c.xr(r), &qe.parts[0].1, n, k, kp2, &mut out);
        out
    };
    for kernel in [c.kk.q2_gemv, c.kk.q2_gemv_m] {
        for m in within(c.ms, &kernel, usize::MAX) {
            c.poison_y()?;
            let call = kernel.call().ptr("x", c.xd).dim("m", m).ptr("w", qw);
            let call = call.ptr("y", c.yd).dim("n", n).dim("k", k).dim("kp", kp2);
            c.launch(call.dim("ldy", n))?;
            b.synchronize(0)?;
            let err = c.err(m, q2ref)?;
            c.row(rows, kernel.spec.name, m, err, 2e-6);
        }
    }
    let dq = b.alloc((n * kp2 * 2) as u64)?;
    let call =
        c.kk.q2_dequant
            .call()
            .ptr("w", qw)
            .dim("n", n)
            .dim("kp", kp2);
    c.launch(call.ptr("out", dq))?;
    b.synchronize(0)?;
    let mut got = vec![0u8; n * kp2 * 2];
    b.download(dq, &mut got)?;
    let same = got == reference::q2_dequant_bf16(&qe.parts[0].1, n, kp2);
    c.bits(rows, "q2g128_dequant_bf16 (bytes)", 0, same);
    b.free(dq);
    let bs = kp2 / Q8_1_ELEMS * Q8_1_BYTES;
    let xq = b.alloc((c.mmax * bs) as u64)?;
    for &m in c.ms {
        let call = c.kk.quant_q8_1.call().ptr("x", c.xd).dim("m", m);
        c.launch(call.dim("k", k).dim("kp", kp2).ptr("out", xq))?;
        c.poison_y()?;
        let call = c.kk.q2_mmq.call().ptr("xq", xq).dim("m", m).ptr("w", qw);
        c.launch(call.ptr("y", c.yd).dim("n", n).dim("kp", kp2).dim("ldy", n))?;
        b.synchronize(0)?;
        let mut q = vec![0u8; m * bs];
        b.download(xq.view(0, q.len() as u64), &mut q)?;
        let first_diff = (0..m).into_par_iter().find_first(|&r| {
            reference::quantize_row_q8_1_act(c.xr(r), kp2) != q[r * bs..(r + 1) * bs]
        });
        if let Some(r) = first_diff {
            report_q8_1_diff(c, m, r, &q[r * bs..(r + 1) * bs], kp2);
        }
        c.bits(rows, "quantize_act_q8_1 (bits)", m, first_diff.is_none());
        let err = c.err(m, |r| {
            let mut out = vec![0f32; n];
            let xr = &q[r * bs..(r + 1) * bs];
            reference::q2_mmq_row(xr, &qe.parts[0].1, n, kp2, &mut out);
            out
        })?;
        c.row(rows, "q2g128_mmq_gemm", m, err, 2e-6);
    }
    b.free(xq);
    b.free(qw);
    Ok(())
}

/// Print the first q8_1 block of row `r` where the device differs from the reference.
pub(crate) fn report_q8_1_diff(c: &Case, m: usize, r: usize, got: &[u8], kp: usize) {
    let want = reference::quantize_row_q8_1_act(c.xr(r), kp);
    let blk = (0..got.len() / Q8_1_BYTES)
        .find(|&j| {
            want[j * Q8_1_BYTES..(j + 1) * Q8_1_BYTES] != got[j * Q8_1_BYTES..(j + 1) * Q8_1_BYTES]
        })
        .unwrap_or(0);
    let (lo, hi) = ((blk * 32).min(c.k), ((blk + 1) * 32).min(c.k));
    eprintln!(
        "quantize_act_q8_1 {}x{} m={m}: row {r} block {blk} differs\n  gpu {:?}\n  cpu {:?}\n  x {:?}",
        c.shape.0,
        c.shape.1,
        &got[blk * Q8_1_BYTES..(blk + 1) * Q8_1_BYTES],
        &want[blk * Q8_1_BYTES..(blk + 1) * Q8_1_BYTES],
        &c.xr(r)[lo..hi]
    );
}

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[("q2g128", |c, r, _| q2g128_rows(c, r))];
