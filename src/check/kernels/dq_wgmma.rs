//! The dequantizing wgmma GEMMs and their inputs: `act_mul_*_il8` bit for bit against
//! `act_mul_*` + `f32_to_bf16_il8`, `f32_to_bf16_il8` against `f32_to_bf16` permuted, `nvfp4_wgmma` against `w4a16_gemm`'s f64 twin, `q4k_wgmma`
//! against `q4k_bf16_row`, and `int8_wgmma` bit for bit against `q4k_mmq_int8_down_gemm`.

use super::*;

/// Tolerance of the bf16 tensor-core GEMMs against their f64 twins: f32 accumulation inside
/// Hopper's wgmma over k up to 14336 (the mma.sync GEMMs' rows hold 2e-6).
const DQ_TOL: f64 = 1e-5;

/// The case's x (`[m, k]` f32) rounded to bf16 in the il8 order by `f32_to_bf16_il8` into a
/// fresh buffer.
fn x_bf16(c: &Case, m: usize) -> GpuResult<DevicePtr> {
    let xb = c.b.alloc((c.mmax * c.k * 2) as u64)?;
    let call = c.kk.to_bf16_il8.call().ptr("x", c.xd).ptr("y", xb);
    c.launch(call.dim("count", m * c.k))?;
    Ok(xb)
}

/// `act_mul_silu_il8` and `act_mul_gelu_il8` (x as both gate and up) against the f32 product
/// rounded by `f32_to_bf16_il8`, bit for bit; and `f32_to_bf16_il8` against `f32_to_bf16`
/// moved by the il8 order.
pub(crate) fn act_bf16_bits(c: &Case, rows: &mut Vec<Row>, m: usize) -> GpuResult<()> {
    let (b, k, x) = (c.b.clone(), c.k, c.xd);
    let kk = c.kk;
    let (f, o1, o2) = (
        b.alloc((m * k * 4) as u64)?,
        b.alloc((m * k * 2) as u64)?,
        b.alloc((m * k * 2) as u64)?,
    );
    let mut run = |fused: Kernel, plain: Kernel| -> GpuResult<()> {
        let act = |kernel: Kernel, out: DevicePtr| {
            let call = kernel.call().ptr("g", x).ptr("u", x).ptr("out", out);
            call.dim("rows", m)
                .dim("cols", k)
                .dim("gs", k)
                .dim("us", k)
                .dim("os", k)
        };
        c.launch(act(fused, o1))?;
        c.launch(act(plain, f))?;
        let call = kk.to_bf16_il8.call().ptr("x", f).ptr("y", o2);
        c.launch(call.dim("count", m * k))?;
        b.synchronize(0)?;
        let mut h = vec![0u8; 4 * m * k];
        let (h1, h2) = h.split_at_mut(2 * m * k);
        b.download(o1, h1)?;
        b.download(o2, h2)?;
        let name = format!("{} (bits = act_mul + f32_to_bf16_il8)", fused.spec.name);
        c.bits(rows, &name, m, h1 == h2);
        Ok(())
    };
    let r = run(kk.act_silu_il8, kk.act_silu).and_then(|_| run(kk.act_gelu_il8, kk.act_gelu));
    // The il8 conversion: f32_to_bf16's bits at the il8 positions.
    let r = r.and_then(|_| {
        c.launch(
            kk.to_bf16
                .call()
                .ptr("x", x)
                .ptr("y", o1)
                .dim("count", m * k),
        )?;
        c.launch(
            kk.to_bf16_il8
                .call()
                .ptr("x", x)
                .ptr("y", o2)
                .dim("count", m * k),
        )?;
        b.synchronize(0)?;
        let mut h = vec![0u8; 4 * m * k];
        let (h1, h2) = h.split_at_mut(2 * m * k);
        b.download(o1, h1)?;
        b.download(o2, h2)?;
        let same = (0..m * k).all(|i| {
            let p = reference::il8_pos(i);
            h1[2 * i..2 * i + 2] == h2[2 * p..2 * p + 2]
        });
        c.bits(
            rows,
            "f32_to_bf16_il8 (bits = f32_to_bf16, il8 order)",
            m,
            same,
        );
        Ok(())
    });
    for p in [f, o1, o2] {
        b.free(p);
    }
    r
}

/// `nvfp4_wgmma` over the NVFP4 MMQ tiles `tiles` (padded rows `np`) of the case's weight, at
/// every m, against the f64 product of the bf16-rounded activations (`nvfp4_ref`).
pub(crate) fn nvfp4_wgmma_rows(
    c: &Case,
    rows: &mut Vec<Row>,
    w: &crate::ffn::Nvfp4Weight,
    tiles: DevicePtr,
    np: usize,
    nvfp4_ref: &(dyn Fn(usize) -> Vec<f32> + Sync),
) -> GpuResult<()> {
    let kernel = c.kk.nvfp4_wgmma;
    if !kernel.ok() {
        return Ok(());
    }
    for &m in c.ms {
        let xb = x_bf16(c, m)?;
        c.poison_y()?;
        let call = kernel
            .call()
            .ptr("x", xb.view(0, (m * c.k * 2) as u64))
            .dim("m", m);
        let call = call
            .ptr("tiles", tiles)
            .float("g", w.global_scale)
            .ptr("y", c.yd);
        let call = call
            .dim("n", c.n)
            .dim("np", np)
            .dim("k", c.k)
            .dim("kp", w.kp);
        let r = c
            .launch(call.dim("ldy", c.n))
            .and_then(|_| c.b.synchronize(0));
        c.b.free(xb);
        r?;
        let err = c.err(m, nvfp4_ref)?;
        c.row(rows, kernel.spec.name, m, err, DQ_TOL);
    }
    Ok(())
}

/// `q4k_wgmma` over the Q4_K gate rows `gate` (`gate_bytes` on the host, padded k `kp`) against
/// `q4k_bf16_row` on the bf16-rounded activations, at every m.
pub(crate) fn q4k_wgmma_rows(
    c: &Case,
    rows: &mut Vec<Row>,
    gate: DevicePtr,
    gate_bytes: &[u8],
    kp: usize,
) -> GpuResult<()> {
    let kernel = c.kk.q4k_wgmma;
    if !kernel.ok() {
        return Ok(());
    }
    let (n, k) = (c.n, c.k);
    let wd = reference::q4k_bf16_weights(gate_bytes, n, kp);
    for &m in c.ms {
        let xb = x_bf16(c, m)?;
        c.poison_y()?;
        let call = kernel
            .call()
            .ptr("x", xb.view(0, (m * k * 2) as u64))
            .dim("m", m);
        let call = call.ptr("w", gate).ptr("y", c.yd).dim("n", n).dim("k", k);
        let r = c
            .launch(call.dim("kp", kp).dim("ldy", n))
            .and_then(|_| c.b.synchronize(0));
        c.b.free(xb);
        r?;
        let err = c.err(m, |r| {
            let xr: Vec<f32> = c.xr(r).iter().map(|&v| ActRound::Bf16.apply(v)).collect();
            let mut out = vec![0f32; n];
            reference::q4k_bf16_row(&xr, &wd, n, k, kp, &mut out);
            out
        })?;
        c.row(rows, kernel.spec.name, m, err, DQ_TOL);
    }
    Ok(())
}

/// `int8_wgmma` against `q4k_mmq_int8_down_gemm` on the same requantized rows (`aq`, `sa`) and
/// int8 weight (`codes`, `scales`, `[n, kp]`), bit for bit: both sums are exact in s32.
#[allow(clippy::too_many_arguments)]
pub(crate) fn int8_wgmma_bits(
    c: &Case,
    rows: &mut Vec<Row>,
    m: usize,
    (aq, sa): (DevicePtr, DevicePtr),
    (codes, scales): (DevicePtr, DevicePtr),
    n: usize,
    kp: usize,
    y_ref: DevicePtr,
) -> GpuResult<()> {
    let kernel = c.kk.int8_wgmma;
    if !kernel.ok() {
        return Ok(());
    }
    let b = c.b.as_ref();
    let y = b.alloc((m * n * 4) as u64)?;
    let call = kernel
        .call()
        .ptr("aq", aq.view(0, (m * kp) as u64))
        .ptr("sa", sa)
        .dim("m", m);
    let call = call.ptr("wq", codes).ptr("sw", scales).ptr("y", y);
    let r = c
        .launch(call.dim("n", n).dim("kp", kp).dim("ldy", n))
        .and_then(|_| b.synchronize(0))
        .and_then(|_| {
            let got = download_f32(b, y)?;
            let want = download_f32(b, y_ref.view(0, (m * n * 4) as u64))?;
            Ok(same_bits(&got, &want))
        });
    b.free(y);
    c.bits(rows, "int8_wgmma (bits = q4k_mmq_int8_down_gemm)", m, r?);
    Ok(())
}
