//! The BF16 rows: the GEMV within its cap, and cuBLAS. `gpu-check`'s kernel section
//! (`check::kernels`), moved here unchanged.

use crate::check::kernels::*;
use crate::check::*;
use crate::converters::layouts;
use crate::gpu::reference::{self, ActRound};
use crate::gpu::{GemmBf16, GpuResult, alloc_upload};

/// BF16: the GEMV within its cap, and cuBLAS.
pub(crate) fn bf16_rows(c: &mut Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let b = c.b.clone();
    let be = layouts::bf16::encode(&c.wf, n, k);
    let bw = crate::ffn::Bf16Weight {
        weight: alloc_upload(b.as_ref(), &be.parts[0].1)?,
        n,
        k,
        kp: be.padded[1],
    };
    let x = c.x.clone();
    let bf16_ref = |r: usize, round: ActRound| {
        let mut out = vec![0f32; n];
        let xr = &x[r * k..(r + 1) * k];
        reference::bf16_row(xr, &be.parts[0].1, n, k, bw.kp, round, &mut out);
        out
    };
    let gemv = c.kk.bf16_gemv;
    let gemv_ms = within(c.ms, &gemv, usize::MAX);
    for &m in c.ms {
        let (xd, yd) = (c.xd, c.yd);
        if gemv_ms.contains(&m) {
            c.poison_y()?;
            c.layer.bf16_gemv(&mut c.ctx, &bw, xd, m, yd, n)?;
            b.synchronize(0)?;
            let err = c.err(m, |r| bf16_ref(r, gemv.spec.round))?;
            c.row(rows, gemv.spec.name, m, err, 2e-6);
        }
        c.poison_y()?;
        let xb = c.layer.to_bf16(&mut c.ctx, xd, m * k)?;
        let g = GemmBf16 {
            x: xb,
            w: bw.weight,
            y: yd,
            m,
            n,
            k,
            kw: bw.kp,
        };
        b.gemm_bf16(&g, 0)?;
        b.synchronize(0)?;
        let err = c.err(m, |r| bf16_ref(r, ActRound::Bf16))?;
        // cuBLAS blocks the k sum its own way: 1e-5.
        c.row(rows, "cublas gemm_bf16", m, err, 1e-5);
    }
    b.free(bw.weight);
    Ok(())
}

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[("bf16", |c, r, _| bf16_rows(c, r))];
