//! The affine rows: the activation quantizer, the GEMVs, the prefill's dequantization and the
//! GPU carry of GGUF blocks, each against its twin.

use crate::check::kernels::*;
use crate::check::*;
use crate::gpu::reference::{self};
use crate::gpu::sizes::*;
use crate::gpu::table::Kernel;
use crate::gpu::{DevicePtr, GpuResult, alloc_upload, download_f32};
use rayon::prelude::*;

/// affine, for every test source kind (GGUF's offset form in groups of 32, int4 groups of 128
/// with half scales, int8 per channel with f32 scales): the activation quantizer bit for bit
/// against its twin; the GEMVs against the f64 product of the carried weights and those
/// activations, and (the activation quantization's own error, 1e-2) against the f64 product
/// with the unquantized ones; the BF16 dequantization bit for bit.
pub(crate) fn affine_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    use crate::testing::{AffineKind, affine_encoded, affine_scheme};
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    for kind in AffineKind::ALL {
        let e = affine_encoded(&c.wf, n, k, kind);
        let (codes, sb, kp) = (&e.parts[0].1, &e.parts[1].1, e.padded[1]);
        let sc = affine_scheme(&e);
        let kernels = if sc.bits == 4 {
            [
                c.kk.affine4_gemv,
                c.kk.affine4_gemv_m,
                c.kk.affine4_gemv_m16,
                c.kk.affine4_gemv_ks,
            ]
        } else {
            [
                c.kk.affine8_gemv,
                c.kk.affine8_gemv_m,
                c.kk.affine8_gemv_m16,
                c.kk.affine8_gemv_ks,
            ]
        };
        let (cd, sd) = (alloc_upload(b, codes)?, alloc_upload(b, sb)?);
        let groups = kp / AFFINE_GROUP;
        let (xq, xs) = (
            b.alloc((c.mmax * kp) as u64)?,
            b.alloc((c.mmax * groups * 16) as u64)?,
        );
        let wdec = crate::converters::layouts::affine::decode(codes, sb, sc, [n, k], kp);
        // Act-order: the activations gathered through the permutation (stored column order).
        let perm = crate::testing::affine_perm(&e);
        let xg: Vec<Vec<f32>> = (0..c.mmax)
            .map(|r| match &perm {
                Some(p) => (0..k).map(|i| c.xr(r)[p[i] as usize]).collect(),
                None => c.xr(r).to_vec(),
            })
            .collect();
        let quantized: Vec<_> = xg
            .par_iter()
            .map(|x| reference::affine_quantize_act_row(x, kp, sc.bits))
            .collect();
        let pd = match &perm {
            Some(p) => alloc_upload(
                b,
                &p.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
            )?,
            None => DevicePtr::NULL,
        };
        let enc = Carried {
            codes,
            sb,
            kp,
            sc,
            kind: kind.name(),
            wdec: &wdec,
            quantized: &quantized,
            xg: &xg,
            perm: pd,
        };
        for (ki, kernel) in kernels.into_iter().enumerate() {
            for m in within(c.ms, &kernel, usize::MAX) {
                gemv_rows(c, rows, &enc, (cd, sd, xq, xs), kernel, m, ki == 0 || m > 1)?;
            }
        }
        if perm.is_none() {
            gemv_act_row(c, rows, &enc, (cd, sd, xq, xs))?;
        }
        dequant_row(c, rows, &enc, (cd, sd), perm.as_deref())?;
        for p in [cd, sd, xq, xs] {
            b.free(p);
        }
        if let Some(p) = &perm {
            gather_row(c, rows, kind.name(), (p, pd))?;
            b.free(pd);
        }
    }
    affine_from_ggml_rows(c, rows)?;
    affine_from_awq_rows(c, rows)?;
    affine_from_gptq_rows(c, rows)
}

/// `affine_dequant_bf16` of one encoding, bit for bit against its twin (act-order: into the
/// source's column order through the inverse permutation).
fn dequant_row(
    c: &Case,
    rows: &mut Vec<Row>,
    e: &Carried,
    (cd, sd): (DevicePtr, DevicePtr),
    perm: Option<&[u32]>,
) -> GpuResult<()> {
    let (n, kp, sc, b) = (c.n, e.kp, e.sc, c.b.as_ref());
    let dq = b.alloc((n * kp * 2) as u64)?;
    let call = c.kk.affine_dequant.call().ptr("codes", cd).ptr("sb", sd);
    let call = call.dim("n", n).dim("kp", kp).dim("bits", sc.bits as usize);
    let call = call.dim("form", sc.form as usize);
    let call = call.dim("gshift", sc.group_shift(kp) as usize);
    c.launch(call.ptr("perm", e.perm).ptr("out", dq))?;
    b.synchronize(0)?;
    let mut got = vec![0u8; n * kp * 2];
    b.download(dq, &mut got)?;
    b.free(dq);
    let want = match perm {
        Some(p) => reference::affine_dequant_bf16_perm(e.codes, e.sb, sc, n, kp, p),
        None => reference::affine_dequant_bf16(e.codes, e.sb, sc, n, kp),
    };
    let what = format!("affine_dequant_bf16 {} (bytes)", e.kind);
    c.bits(rows, &what, 0, got == want);
    Ok(())
}

/// `affine_gather_bf16`: the prefill's BF16 activations against its twin: the input bit for bit,
/// and the SiLU and GELU act-muls (`u` the input again) within one BF16 step (2^-7 relative:
/// the device's `expf` and `tanhf` may differ from the host's by an ulp of f32, which can move
/// the rounding to BF16 by one step), in the stored column order of act-order weights (`perm` on
/// the host and the device) and in order.
fn gather_row(
    c: &Case,
    rows: &mut Vec<Row>,
    kind: &str,
    (perm, pd): (&[u32], DevicePtr),
) -> GpuResult<()> {
    let (m, k, b) = (c.mmax, c.k, c.b.as_ref());
    let y = b.alloc((m * k * 2) as u64)?;
    let xs: Vec<f32> = (0..m).flat_map(|r| c.xr(r).to_vec()).collect();
    for (act, gathered) in [(0usize, true), (1, true), (2, false), (1, false)] {
        let pp = if gathered { pd } else { DevicePtr::NULL };
        let call = c.kk.affine_gather.call().ptr("x", c.xd).ptr("u", c.xd);
        let call = call.dim("act", act).ptr("perm", pp).dim("m", m);
        c.launch(call.dim("k", k).dim("ld", k).ptr("y", y))?;
        b.synchronize(0)?;
        let mut got = vec![0u8; m * k * 2];
        b.download(y, &mut got)?;
        let v: Vec<f32> = (0..m)
            .flat_map(|r| reference::affine_act_row(&xs, &xs, act, r, k, k).unwrap_or_default())
            .collect();
        let want = reference::affine_gather_bf16(&v, gathered.then_some(perm), m, k);
        let order = if gathered { "gathered" } else { "in order" };
        if act == 0 {
            let what = format!("affine_gather_bf16 {kind} act 0 {order} (bytes)");
            c.bits(rows, &what, m, got == want);
        } else {
            let what = format!("affine_gather_bf16 {kind} act {act} {order} (one BF16 step)");
            c.row(rows, &what, m, bf16_step_err(&got, &want), 1.0 / 128.0);
        }
    }
    b.free(y);
    Ok(())
}

/// The largest `|a - b| / |b|` over two BF16 byte arrays (0 where they are equal; infinite
/// where only `b` is 0 or either is NaN).
fn bf16_step_err(a: &[u8], b: &[u8]) -> f64 {
    let v = |s: &[u8], i: usize| {
        f32::from_bits((u16::from_le_bytes([s[2 * i], s[2 * i + 1]]) as u32) << 16) as f64
    };
    (0..b.len() / 2)
        .map(|i| {
            let (x, y) = (v(a, i), v(b, i));
            let e = (x - y).abs() / y.abs();
            match (x == y, e.is_nan()) {
                (true, _) => 0.0,
                (false, true) => f64::INFINITY,
                (false, false) => e,
            }
        })
        .fold(0.0, f64::max)
}

/// `affine_from_gptq` (the GPU carry of GPTQ's tensors) against the converter: bytes at 4 and 8
/// bits with an ordered `g_idx`, and at 4 bits each refusal flagged (an infinite scale,
/// a zero point field of all ones, a `g_idx` out of group order as act-order has it).
fn affine_from_gptq_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    if !n.is_multiple_of(16) || !k.is_multiple_of(16) {
        return Ok(());
    }
    let group = if k.is_multiple_of(128) { 128 } else { k };
    let ordered: Vec<u8> = (0..k)
        .flat_map(|i| ((i / group) as i32).to_le_bytes())
        .collect();
    for bits in [4, 8] {
        let ([qw, qz, sc], g) = crate::testing::gptq_tensors(&c.wf, n, k, bits, group);
        let want = crate::converters::layouts::affine::from_groups(&g);
        let (codes, sb, kp) = (&want.parts[0].1, &want.parts[1].1, want.padded[1]);
        let sgroup = crate::testing::affine_scheme(&want).group;
        let cases: &[&str] = if bits == 4 {
            &[
                "bytes = converter",
                "infinite scale",
                "zero all ones",
                "g_idx out of group order",
            ]
        } else {
            &["bytes = converter"]
        };
        for &case in cases {
            let (mut sc, mut qz, mut gi) = (sc.clone(), qz.clone(), ordered.clone());
            match case {
                "infinite scale" => sc[2..4].copy_from_slice(&half::f16::INFINITY.to_le_bytes()),
                "zero all ones" => qz[0] |= 0x0F,
                "g_idx out of group order" => gi[..4].copy_from_slice(&1i32.to_le_bytes()),
                _ => {}
            }
            let (dw, dz) = (alloc_upload(b, &qw)?, alloc_upload(b, &qz)?);
            let (ds, dg) = (alloc_upload(b, &sc)?, alloc_upload(b, &gi)?);
            let (gc, gs, flagged) = run_carry(c, (codes.len(), sb.len()), |cd, sd, bad| {
                let call = c.kk.affine_from_gptq.call().ptr("qweight", dw);
                let call = call.ptr("qzeros", dz).ptr("scales", ds).ptr("g_idx", dg);
                let call = call.dim("bits", bits as usize).dim("n", n).dim("k", k);
                let call = call.dim("kp", kp).dim("group", group).dim("sgroup", sgroup);
                call.ptr("codes", cd).ptr("sb", sd).ptr("bad", bad)
            })?;
            let ok = if case == "bytes = converter" {
                gc == *codes && gs == *sb && !flagged
            } else {
                flagged
            };
            c.bits(
                rows,
                &format!("affine_from_gptq {bits}-bit ({case})"),
                0,
                ok,
            );
            for p in [dw, dz, ds, dg] {
                b.free(p);
            }
        }
    }
    Ok(())
}

/// `affine_from_awq` (the GPU carry of AutoAWQ's tensors) against the converter, bytes and
/// refusal flag (one scale made infinite).
fn affine_from_awq_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    if !n.is_multiple_of(8) || !k.is_multiple_of(2) {
        return Ok(());
    }
    let group = if k.is_multiple_of(128) { 128 } else { k };
    let ([qw, qz, mut sc], g) = crate::testing::awq_tensors(&c.wf, n, k, group);
    let want = crate::converters::layouts::affine::from_groups(&g);
    let (codes, sb, kp) = (&want.parts[0].1, &want.parts[1].1, want.padded[1]);
    let sgroup = crate::testing::affine_scheme(&want).group;
    for broken in [false, true] {
        if broken {
            sc[2..4].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
        }
        let (dw, dz, ds) = (
            alloc_upload(b, &qw)?,
            alloc_upload(b, &qz)?,
            alloc_upload(b, &sc)?,
        );
        let (gc, gs, flagged) = run_carry(c, (codes.len(), sb.len()), |cd, sd, bad| {
            let call = c.kk.affine_from_awq.call().ptr("qweight", dw);
            let call = call.ptr("qzeros", dz).ptr("scales", ds);
            let call = call.dim("n", n).dim("k", k).dim("kp", kp);
            let call = call.dim("group", group).dim("sgroup", sgroup);
            call.ptr("codes", cd).ptr("sb", sd).ptr("bad", bad)
        })?;
        let ok = if broken {
            flagged
        } else {
            gc == *codes && gs == *sb && !flagged
        };
        let what = if broken {
            "affine_from_awq (an infinite scale flagged)"
        } else {
            "affine_from_awq (bytes = converter)"
        };
        c.bits(rows, what, 0, ok);
        for p in [dw, dz, ds] {
            b.free(p);
        }
    }
    Ok(())
}

/// `affine_from_ggml` (the GPU carry of GGUF Q4_0 / Q4_1 / Q8_0 blocks) against the converter,
/// bytes and refusal flag.
fn affine_from_ggml_rows(c: &Case, rows: &mut Vec<Row>) -> GpuResult<()> {
    use crate::GgmlType;
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    if !k.is_multiple_of(AFFINE_GROUP) {
        return Ok(());
    }
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let raw = crate::testing::gen_model::encode_as(ty, &c.wf).expect("a carried type");
        let Ok(want) = crate::converters::layouts::affine::carry(ty, &raw, n, k) else {
            continue;
        };
        let (codes, sb) = (&want.parts[0].1, &want.parts[1].1);
        let kp = want.padded[1];
        let rd = alloc_upload(b, &raw)?;
        let (gc, gs, flagged) = run_carry(c, (codes.len(), sb.len()), |cd, sd, bad| {
            let call = c.kk.affine_from_ggml.call().ptr("raw", rd);
            let call = call.dim("ty", ty as usize).dim("n", n).dim("k", k);
            let call = call.dim("kp", kp).ptr("codes", cd);
            call.ptr("sb", sd).ptr("bad", bad)
        })?;
        let what = format!("affine_from_ggml {} (bytes = converter)", ty.name());
        c.bits(rows, &what, 0, gc == *codes && gs == *sb && !flagged);
        b.free(rd);
    }
    Ok(())
}

/// One GPU carry (`call`, given its codes, scale pairs and refusal flag buffers of
/// `(codes, pairs)` bytes, the flag zeroed): the codes and pairs it wrote and whether it flagged.
fn run_carry(
    c: &Case,
    (codes, pairs): (usize, usize),
    call: impl FnOnce(DevicePtr, DevicePtr, DevicePtr) -> crate::gpu::table::Call,
) -> GpuResult<(Vec<u8>, Vec<u8>, bool)> {
    let b = c.b.as_ref();
    let (cd, sd, bad) = (b.alloc(codes as u64)?, b.alloc(pairs as u64)?, b.alloc(4)?);
    b.fill(bad, 0)?;
    c.launch(call(cd, sd, bad))?;
    b.synchronize(0)?;
    let (mut gc, mut gs, mut flag) = (vec![0u8; codes], vec![0u8; pairs], [1u8; 4]);
    b.download(cd, &mut gc)?;
    b.download(sd, &mut gs)?;
    b.download(bad, &mut flag)?;
    for p in [cd, sd, bad] {
        b.free(p);
    }
    Ok((gc, gs, flag != [0; 4]))
}

/// `affine{4,8}_gemv_act` at one row, gate and up both this encoding: gate's output against the
/// f64 twin over the same activation codes (2e-6), up's equal to gate's, and the fused down input
/// (SiLU, for 4-bit weights; padded k the output count rounded up to 256) bit for bit what the
/// device's `affine_quantize_act` gives the act-mul of the kernel's own outputs; twice, the
/// second call after the counters were set back (the same bits again, the counters zero).
fn gemv_act_row(
    c: &Case,
    rows: &mut Vec<Row>,
    e: &Carried,
    (cd, sd, xq, xs): (DevicePtr, DevicePtr, DevicePtr, DevicePtr),
) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    let (kp, bits) = (e.kp, e.sc.bits);
    let kpd = n.div_ceil(256) * 256;
    let kernel = if bits == 4 {
        c.kk.affine4_gemv_act
    } else {
        c.kk.affine8_gemv_act
    };
    let shape = (1, k, k, kp, bits as usize);
    quantize(c, (c.xd, c.xd, 0), shape, DevicePtr::NULL, (xq, xs))?;
    let yu = b.alloc((n * 4) as u64)?;
    let (dq, ds, cnt) = (
        b.alloc(kpd as u64)?,
        b.alloc((kpd / AFFINE_GROUP * 16) as u64)?,
        b.alloc((kpd / AFFINE_GROUP * 4) as u64)?,
    );
    b.fill(cnt, 0)?;
    let mut same = true;
    for _ in 0..2 {
        c.poison_y()?;
        b.fill(dq, 0xA5)?;
        let call = kernel.call().ptr("xq", xq).ptr("xs", xs).dim("m", 1);
        let call = call.ptr("cg", cd).ptr("sg", sd).ptr("yg", c.yd);
        let call = call.ptr("cu", cd).ptr("su", sd).ptr("yu", yu);
        let call = call.dim("n", n).dim("kp", kp);
        let call = call.dim("form", e.sc.form as usize);
        let call = call.dim("gshift", e.sc.group_shift(kp) as usize);
        let call = call.dim("act", 1).ptr("dq", dq).ptr("ds", ds);
        c.launch(call.dim("kpd", kpd).dim("bitsd", 4).ptr("cnt", cnt))?;
        same &= fused_input_same(c, yu, (dq, ds, cnt), kpd)?;
    }
    let err = c.err(1, |_| {
        let mut out = vec![0f32; n];
        let (q, d) = &e.quantized[0];
        reference::affine_q8_row(q, d, e.codes, e.sb, e.sc, n, kp, &mut out);
        out
    })?;
    let name = kernel.spec.name;
    c.row(rows, &format!("{name} {}", e.kind), 1, err, 2e-6);
    let what = format!("{name} {} down input (bits, twice)", e.kind);
    c.bits(rows, &what, 1, same);
    for p in [yu, dq, ds, cnt] {
        b.free(p);
    }
    Ok(())
}

/// `affine_quantize_act` of `m` rows: `(x, u, act)` its values, `(k, ld, kp, bits)` its
/// shape, `perm` the column permutation (null for none), into `(xq, xs)`.
fn quantize(
    c: &Case,
    (x, u, act): (DevicePtr, DevicePtr, usize),
    (m, k, ld, kp, bits): (usize, usize, usize, usize, usize),
    perm: DevicePtr,
    (xq, xs): (DevicePtr, DevicePtr),
) -> GpuResult<()> {
    let call = c.kk.affine_quant.call().ptr("x", x).ptr("u", u);
    let call = call.dim("act", act).dim("m", m).dim("k", k).dim("ld", ld);
    let call = call.dim("kp", kp).dim("bits", bits).ptr("perm", perm);
    c.launch(call.ptr("xq", xq).ptr("xs", xs))
}

/// Whether the fused down input `(dq, ds)` (4-bit, padded k `kpd`) equals, bit for bit, what
/// the device's `affine_quantize_act` gives the SiLU act-mul of the kernel's own gate (`c.yd`)
/// and up (`yu`) outputs (the device's `expf` is the fused kernel's), gate's and up's outputs
/// are equal (the same weights), and the arrival counters `cnt` are back at zero.
fn fused_input_same(
    c: &Case,
    yu: DevicePtr,
    (dq, ds, cnt): (DevicePtr, DevicePtr, DevicePtr),
    kpd: usize,
) -> GpuResult<bool> {
    let (n, b) = (c.n, c.b.as_ref());
    let (rq, rs) = (b.alloc(kpd as u64)?, b.alloc(ds.bytes)?);
    quantize(
        c,
        (c.yd, yu, 1),
        (1, n, n, kpd, 4),
        DevicePtr::NULL,
        (rq, rs),
    )?;
    b.synchronize(0)?;
    let yg = download_f32(b, c.yd.view(0, (n * 4) as u64))?;
    let yu = download_f32(b, yu)?;
    let (mut got, mut q) = (vec![0u8; kpd], vec![0u8; kpd]);
    b.download(dq, &mut got)?;
    b.download(rq, &mut q)?;
    let (gs, d) = (download_f32(b, ds)?, download_f32(b, rs)?);
    let mut counters = vec![0u8; cnt.bytes as usize];
    b.download(cnt, &mut counters)?;
    b.free(rq);
    b.free(rs);
    let bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    Ok(got == q && bits(&gs, &d) && counters.iter().all(|&x| x == 0) && bits(&yg, &yu))
}

/// One affine encoding's bytes and what its checks compare against: the decoded weights
/// (`wdec`, `[n, k]`) and each activation row's twin quantization.
struct Carried<'a> {
    codes: &'a [u8],
    sb: &'a [u8],
    kp: usize,
    sc: crate::converters::layouts::affine::Scheme,
    kind: &'static str,
    wdec: &'a [f32],
    quantized: &'a [(Vec<u8>, Vec<f32>)],
    /// Each activation row in stored column order (gathered through `perm`).
    xg: &'a [Vec<f32>],
    /// The column permutation on the device, or null.
    perm: DevicePtr,
}

/// One GEMV `kernel` at `m` rows over the device-quantized activations: the quantizer's bits
/// (with `check_quantizer`), the GEMV against the f64 twin over the same activation codes, and
/// against the f64 product with the unquantized activations (1e-2).
fn gemv_rows(
    c: &Case,
    rows: &mut Vec<Row>,
    e: &Carried,
    (cd, sd, xq, xs): (DevicePtr, DevicePtr, DevicePtr, DevicePtr),
    kernel: Kernel,
    m: usize,
    check_quantizer: bool,
) -> GpuResult<()> {
    let (n, k, b) = (c.n, c.k, c.b.as_ref());
    let (kp, bits, groups) = (e.kp, e.sc.bits, e.kp / AFFINE_GROUP);
    let shape = (m, k, k, kp, bits as usize);
    quantize(c, (c.xd, c.xd, 0), shape, e.perm, (xq, xs))?;
    c.poison_y()?;
    let call = kernel.call().ptr("xq", xq).ptr("xs", xs).dim("m", m);
    let call = call
        .ptr("cg", cd)
        .ptr("sg", sd)
        .ptr("yg", c.yd)
        .ptr("cu", cd);
    let call = call
        .ptr("su", sd)
        .ptr("yu", c.yd)
        .dim("projs", 1)
        .dim("n", n);
    let call = call.dim("form", e.sc.form as usize);
    let call = call.dim("gshift", e.sc.group_shift(kp) as usize);
    c.launch(call.dim("kp", kp).dim("ldy", n))?;
    b.synchronize(0)?;
    if check_quantizer {
        let mut gq = vec![0u8; m * kp];
        b.download(xq.view(0, gq.len() as u64), &mut gq)?;
        let gs = download_f32(b, xs.view(0, (m * groups * 16) as u64))?;
        let same = (0..m).all(|r| {
            let (q, d) = &e.quantized[r];
            gq[r * kp..(r + 1) * kp] == q[..]
                && gs[r * groups * 4..(r + 1) * groups * 4]
                    .iter()
                    .zip(d)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
        });
        let gather = if e.perm.is_null() { "" } else { ", gathered" };
        let what = format!("affine_quantize_act {bits}-bit (bits{gather})");
        c.bits(rows, &what, m, same);
    }
    let err = c.err(m, |r| {
        let mut out = vec![0f32; n];
        let (q, d) = &e.quantized[r];
        reference::affine_q8_row(q, d, e.codes, e.sb, e.sc, n, kp, &mut out);
        out
    })?;
    c.row(
        rows,
        &format!("{} {}", kernel.spec.name, e.kind),
        m,
        err,
        2e-6,
    );
    let err = c.err(m, |r| {
        (0..n)
            .map(|j| {
                let row = e.wdec[j * k..(j + 1) * k].iter().zip(&e.xg[r]);
                row.map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() as f32
            })
            .collect()
    })?;
    let what = format!("{} {} vs unquantized activations", kernel.spec.name, e.kind);
    c.row(rows, &what, m, err, 1e-2);
    Ok(())
}

/// Its kernel groups in `gpu-check`'s kernel section (`check::kernels`, after the table's rules,
/// in `Layout` order), by the name `--arms` selects them with.
pub(crate) static GROUPS: &[(&str, Group)] = &[("affine", |c, r, _| affine_rows(c, r))];
