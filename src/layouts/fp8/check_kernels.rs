//! The FP8 rows: the W8A16 kernels through the layer's `fp8_launch`. `gpu-check`'s kernel section
//! (`check::kernels`), moved here unchanged.

use crate::check::kernels::*;
use crate::check::*;
use crate::gpu::GpuResult;
use crate::gpu::reference::{self};

/// The W8A16 kernels through the layer's `fp8_launch` (which splits m by the kernel's cap).
pub(crate) fn fp8_rows(c: &mut Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k) = (c.n, c.k);
    let (w, codes, scales) = upload_fp8(c.b.as_ref(), &c.wf, n, k)?;
    let kk = c.kk;
    for kernel in [
        kk.fp8_b4,
        kk.fp8_mma,
        kk.fp8_mma_ilp,
        kk.fp8_b16,
        kk.fp8_m16,
        kk.fp8_pipe,
        kk.fp8_base,
        kk.fp8_b4_cvt,
    ] {
        let limit = if kernel.spec.row_cap.is_some() {
            FP8_CHUNKED_MAX_M
        } else {
            usize::MAX
        };
        for m in c.ms.iter().copied().filter(|&m| m <= limit) {
            c.poison_y()?;
            let (xd, yd) = (c.xd, c.yd);
            c.layer.fp8_launch(&mut c.ctx, kernel, &w, xd, m, yd, n)?;
            c.b.synchronize(0)?;
            let err = c.err(m, |r| {
                let mut out = vec![0f32; n];
                let round = kernel.spec.round;
                reference::fp8_block_row(c.xr(r), &codes, &scales, n, k, w.kp, round, &mut out);
                out
            })?;
            c.row(rows, kernel.spec.name, m, err, 2e-6);
        }
    }
    c.b.free(w.weight);
    c.b.free(w.scale);
    Ok(())
}

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[
    ("fp8", |c, r, _| fp8_rows(c, r)),
    ("fp8_w8a8", |c, r, _| super::check_w8a8::fp8_w8a8_rows(c, r)),
];
