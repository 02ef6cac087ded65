//! Its arms of `bench-gpu` (`check::bench`, in `Layout` order): its GEMVs to 4 rows and its dequantizing prefill, for each of its schemes.

use crate::check::bench::{BenchArm, KernelLines, SmallArm, bench};
use crate::check::bench_decode::part;
use crate::check::bench_decode::{kernel_line, per_call, probe_time};
use crate::converters::layouts::affine::Scheme;
use crate::gpu::sizes::*;
use crate::gpu::table::{Kernel, Kernels};
use crate::gpu::{DevicePtr, GpuBackend, GpuResult, upload_f32};
use crate::layouts::affine::groups::Form;
use crate::testing::*;

/// 4-bit codes and a 4-byte scale pair per 32 values.
const AFFINE4_BPE: f64 = 0.5 + 4.0 / AFFINE_GROUP as f64;
/// 8-bit codes and a 4-byte scale pair per 32 values.
const AFFINE8_BPE: f64 = 1.0 + 4.0 / AFFINE_GROUP as f64;
/// int4 g128: 4-bit codes and a 4-byte pair (half scale, half zero point) per 128.
const AFFINE4_G128_BPE: f64 = 0.5 + 4.0 / 128.0;
/// int8 per channel: 8-bit codes and one 8-byte pair a row (under 0.1%: not counted).
const AFFINE8_CHANNEL_BPE: f64 = 1.0;

/// The scheme the arm `name` times: gate and up GEMVs, then the down projection on the
/// k-split form (m = 1, one projection).
fn gemvs(name: &str, h: usize, i: usize) -> Vec<(u64, usize)> {
    let row = |k: usize| affine_bench_scheme(name, k).row_bytes(k);
    vec![
        part(i, row(h), AFFINE_GEMV_BLOCK_ROWS),
        part(i, row(h), AFFINE_GEMV_BLOCK_ROWS),
        part(h, row(i), AFFINE_GEMV_KS_BLOCK_ROWS),
    ]
}

/// Its arms on the llama-8B FFN shape.
#[rustfmt::skip]
pub(crate) static ARMS: [BenchArm; 7] = [
    // Integer weights carried from the source: GEMVs to 4 rows, BF16 dequantization then the BF16 GEMM.
    bench("affine 4-bit (Q4_1) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Q4_1), &[], Some(AFFINE4_BPE), true).probe(gemvs),
    bench("affine 4-bit g128 (int4, half zero points) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Int4G128), &[], Some(AFFINE4_G128_BPE), true).probe(gemvs),
    bench("affine 4-bit g128 act-order (GPTQ desc_act: activations gathered) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Int4G128Perm), &[], Some(AFFINE4_G128_BPE), true).probe(gemvs),
    bench("affine 8-bit (Q8_0) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Q8_0), &[], Some(AFFINE8_BPE), true).probe(gemvs),
    bench("affine 8-bit per channel (int8, f32 zero points) GEMV / dequant + BF16 GEMM", |b, l, w| install_affine(b, l, w, AffineKind::Int8Channel), &[], Some(AFFINE8_CHANNEL_BPE), true).probe(gemvs),
    // The down input's quantization inside the gate and up launch (one row).
    bench("affine 4-bit g128 (int4, half zero points), fused down input", |b, l, w| install_affine(b, l, w, AffineKind::Int4G128), &[("METRALE_AFFINE_FUSED_ACT", "1")], Some(AFFINE4_G128_BPE), false).probe(gemvs),
    bench("affine 8-bit per channel (int8, f32 zero points), fused down input", |b, l, w| install_affine(b, l, w, AffineKind::Int8Channel), &[("METRALE_AFFINE_FUSED_ACT", "1")], Some(AFFINE8_CHANNEL_BPE), false).probe(gemvs),
];

/// Its arms on the SmolLM2 shape (576 x 1536): one decode row, launched and as a CUDA graph.
pub(crate) static SMALL: [SmallArm; 1] = [SmallArm {
    name: "affine 4-bit",
    install: |b, l, w| install_affine(b, l, w, AffineKind::Q4_1),
    levers: &[],
}];

/// Its kernel lines (selected with the other decode kernels' by `decode kernel`).
pub(crate) static KERNELS: &[KernelLines] = &[("decode kernel affine", kernel_lines)];

/// The `affine` scheme a bench arm or kernel line named `name` times, for rows of `k`: 4 or 8
/// bits; groups of 128 with half zero points ("g128"), one group a row with f32 ones ("per
/// channel"), else GGUF's groups of 32 with offsets.
fn affine_bench_scheme(name: &str, k: usize) -> Scheme {
    let bits = if name.contains("4-bit") { 4 } else { 8 };
    if name.contains("g128") {
        Scheme {
            bits,
            group: 128,
            form: Form::Zero,
        }
    } else if name.contains("per channel") {
        Scheme {
            bits,
            group: k,
            form: Form::ZeroF32,
        }
    } else {
        Scheme::ggml(bits)
    }
}

/// The `affine` GEMVs (4- and 8-bit codes, a half scale and offset per 32 values) on both
/// shapes at m = 1, 2, 4, 8 and 16 (the batch-4 and batch-16 forms both at 2 and 4) over
/// activations quantized once beforehand, against the probe of their grids over the same bytes;
/// the activation quantizer and the prefill's BF16 dequantization alone.
fn kernel_lines(
    b: &dyn GpuBackend,
    ceiling: f64,
    rng: &mut Rand,
    out: &mut dyn FnMut(String),
) -> GpuResult<()> {
    let ks = &Kernels::resolve(b);
    const M: usize = AFFINE_GEMV_MAX_ROWS;
    let x = b.alloc((M * 14336 * 4) as u64)?;
    upload_f32(b, x, &rng.vec(M * 14336, 1.0))?;
    let (xq, xs) = (
        b.alloc((M * 14336) as u64)?,
        b.alloc((M * 14336 / 2) as u64)?,
    );
    let codes = b.alloc(14336 * 4096)?;
    b.fill(codes, 0x5A)?;
    let sb = b.alloc((14336 * 4096 / AFFINE_GROUP * 4) as u64)?;
    b.fill(sb, 0x3C)?;
    let (codes2, sb2) = (b.alloc(codes.bytes)?, b.alloc(sb.bytes)?);
    b.fill(codes2, 0x5A)?;
    b.fill(sb2, 0x3C)?;
    let y = b.alloc((M * 14336 * 4) as u64)?;
    let dq = b.alloc(14336 * 4096 * 2)?;
    for (shape, n, k) in [
        ("gate 14336x4096", 14336usize, 4096usize),
        ("down 4096x14336", 4096, 14336),
    ] {
        for scheme in ["4-bit", "4-bit g128", "8-bit", "8-bit per channel"] {
            let sc = affine_bench_scheme(scheme, k);
            let bits = sc.bits as usize;
            let kernels = if bits == 4 {
                [
                    ks.affine4_gemv,
                    ks.affine4_gemv_m,
                    ks.affine4_gemv_m16,
                    ks.affine4_gemv_ks,
                ]
            } else {
                [
                    ks.affine8_gemv,
                    ks.affine8_gemv_m,
                    ks.affine8_gemv_m16,
                    ks.affine8_gemv_ks,
                ]
            };
            let (form_n, gshift) = (sc.form as usize, sc.group_shift(k) as usize);
            let quant = |m: usize| {
                let c = ks.affine_quant.call().ptr("x", x).ptr("u", x).dim("act", 0);
                let c = c.dim("m", m).dim("k", k).dim("ld", k).dim("kp", k);
                c.dim("bits", bits)
                    .ptr("xq", xq)
                    .ptr("xs", xs)
                    .ptr("perm", DevicePtr::NULL)
                    .finish()?
                    .run(b, 0)
            };
            quant(M)?;
            let row = sc.row_bytes(k);
            let bufs = AffineBufs {
                xq,
                xs,
                codes: [codes, codes2],
                sb: [sb, sb2],
                y,
            };
            let what = (shape, scheme, n, k);
            affine_gemv_lines(b, kernels, &bufs, what, sc, ceiling, out)?;
            let t = per_call(b, || quant(1))?;
            out(format!(
                "decode kernel affine_quantize_act k={k} {scheme} m=1 {:>7.1} us",
                t * 1e6
            ));
            // The prefill's dequantization of this projection to BF16, alone.
            let call = || {
                let c = ks.affine_dequant.call().ptr("codes", codes).ptr("sb", sb);
                let c = c.dim("n", n).dim("kp", k).dim("bits", bits);
                let c = c.dim("form", form_n).dim("gshift", gshift);
                let c = c.ptr("perm", DevicePtr::NULL);
                c.ptr("out", dq).finish()?.run(b, 0)
            };
            let t = per_call(b, call)?;
            let bytes = (n * row + n * k * 2) as f64; // read + written
            out(format!(
                "prefill kernel affine_dequant_bf16 {shape} {scheme} {:>7.1} us {:>6.0} GB/s read+written {:>5.1}% of copy ceiling",
                t * 1e6,
                bytes / t / 1e9,
                100.0 * bytes / t / ceiling
            ));
        }
    }
    for p in [x, xq, xs, codes, sb, codes2, sb2, y, dq] {
        b.free(p);
    }
    Ok(())
}

/// The affine bench's device buffers: activation codes and records, two projections' codes
/// and scale pairs, the output.
struct AffineBufs {
    xq: DevicePtr,
    xs: DevicePtr,
    codes: [DevicePtr; 2],
    sb: [DevicePtr; 2],
    y: DevicePtr,
}

/// One scheme's GEMV lines on one shape `(shape, scheme, n, k)`: `kernels` (the one-row,
/// batch-4, batch-16 and k-split forms) at their row counts, one projection and (gate shape)
/// two, each against the probe of its grid.
fn affine_gemv_lines(
    b: &dyn GpuBackend,
    kernels: [Kernel; 4],
    bufs: &AffineBufs,
    (shape, scheme, n, k): (&str, &str, usize, usize),
    sc: Scheme,
    ceiling: f64,
    out: &mut dyn FnMut(String),
) -> GpuResult<()> {
    let AffineBufs {
        xq,
        xs,
        codes: [codes, codes2],
        sb: [sb, sb2],
        y,
    } = *bufs;
    let (form_n, gshift) = (sc.form as usize, sc.group_shift(k) as usize);
    let row = sc.row_bytes(k);
    let probe = probe_time(b, &[part(n, row, AFFINE_GEMV_BLOCK_ROWS)])?;
    let probe_ks = probe_time(b, &[part(n, row, AFFINE_GEMV_KS_BLOCK_ROWS)])?;
    // The batch-4 and batch-16 forms both at 2 and 4 rows; the k-split form (one
    // projection) at 1.
    let variants = [
        (0, 1usize),
        (3, 1),
        (1, 2),
        (2, 2),
        (1, 4),
        (2, 4),
        (2, 8),
        (2, 16),
    ];
    for (variant, m) in variants {
        let kernel = kernels[variant];
        if !kernel.ok() {
            continue;
        }
        let probe = if variant == 3 { probe_ks } else { probe };
        // One projection, and (gate shape, not the k-split form) gate and up in one
        // launch, up's codes and scale pairs a second buffer (the same buffer twice
        // would be read from L2).
        let both = n == 14336 && variant != 3;
        for projs in [1usize, 2].into_iter().take(if both { 2 } else { 1 }) {
            let call = || {
                let c = kernel.call().ptr("xq", xq).ptr("xs", xs).dim("m", m);
                let c = c.ptr("cg", codes).ptr("sg", sb).ptr("yg", y);
                let c = c.ptr("cu", codes2).ptr("su", sb2).ptr("yu", y);
                let c = c.dim("projs", projs).dim("n", n).dim("kp", k);
                let c = c.dim("form", form_n).dim("gshift", gshift);
                c.dim("ldy", n).finish()?.run(b, 0)
            };
            let t = per_call(b, call)?;
            let what = format!("{shape} {scheme} m={m} x{projs}");
            let bytes = (projs * n * row) as f64;
            let probe = probe * projs as f64;
            out(kernel_line(&kernel, &what, (t, bytes, probe), ceiling));
        }
    }
    Ok(())
}
