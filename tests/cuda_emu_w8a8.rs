//! The W8A8 kernels on the C++ emulator (`tests/cuda_emu/harness.rs`): the FP8 activation
//! quantizer (on an E4M3 encoder stand-in), the portable GEMM and its decode GEMV (on an e4m3
//! m16n8k32 MMA stand-in), and the sm_90a `w8a8_wgmma` GEMMs on stand-ins for their copies and
//! their wgmma, which read the shared memory through the descriptors and the 128-byte swizzle as
//! the PTX ISA defines them. Each is compared with the CPU twins (`quantize_row_fp8`,
//! `w8a8_row`): bit for bit where the contract says so, within 2e-6 of the f64 reference
//! otherwise, and bit for bit between launches that must agree (the fixed path's invariance).

#[path = "cuda_emu/harness.rs"]
mod harness;
use harness::*;
use metrale_pack::converters::layouts;
use metrale_pack::gpu::reference;
use metrale_pack::testing::{Rand, rel_err};

/// A random `w8a8` weight (`n` x `k`: codes, scales as bytes and as f32, padded k) and `m`
/// activation rows of `k` quantized by the CPU twin (codes `[m, kp]`, scales).
struct W8a8Case {
    w: Vec<u8>,
    sw: Vec<u8>,
    swf: Vec<f32>,
    kp: usize,
    q: Vec<u8>,
    sx: Vec<f32>,
}

fn w8a8_case(r: &mut Rand, n: usize, k: usize, m: usize) -> W8a8Case {
    let e = layouts::w8a8::encode(&r.vec(n * k, 0.05), n, k);
    let (w, sw, kp) = (e.parts[0].1.clone(), e.parts[1].1.clone(), e.padded[1]);
    let x = r.vec(m * k, 1.0);
    let (mut q, mut sx) = (Vec::new(), Vec::new());
    for i in 0..m {
        let (qr, s) = reference::quantize_row_fp8(&x[i * k..(i + 1) * k], kp);
        q.extend(qr);
        sx.push(s);
    }
    W8a8Case {
        swf: bf32(&sw),
        w,
        sw,
        kp,
        q,
        sx,
    }
}

/// A W8A8 GEMM launch's arguments (`q, sx, m, w, sw, y, n, kp, ldy`) over `rows` of the case,
/// the output poisoned with NaN.
fn w8a8_args(c: &W8a8Case, rows: std::ops::Range<usize>, n: usize) -> [A; 9] {
    let (m, kp) = (rows.len(), c.kp);
    [
        A::P(c.q[rows.start * kp..rows.end * kp].to_vec()),
        A::P(f32b(&c.sx[rows])),
        A::I(m),
        A::P(c.w.clone()),
        A::P(c.sw.clone()),
        A::P(f32b(&vec![f32::NAN; m * n])),
        A::I(n),
        A::I(kp),
        A::I(n),
    ]
}

/// A quantizer's input: rows of `x`, or (the fused quantizers) `act(g, u)` of gate and up rows
/// with their strides.
enum QuantIn<'a> {
    Rows(&'a [f32]),
    Product {
        g: &'a [f32],
        u: &'a [f32],
        gs: usize,
        us: usize,
        act: usize,
    },
}

/// Run FP8 activation quantizer `kernel` over `m` rows of `k` (padded to `kp`) on the grid and
/// block the kernel table gives it: `(column blocks, codes, scales)`, the outputs poisoned first.
fn run_quantizer(
    exe: &std::path::Path,
    kernel: metrale_pack::gpu::table::Kernel,
    input: &QuantIn,
    m: usize,
    k: usize,
    kp: usize,
) -> (usize, Vec<u8>, Vec<f32>) {
    use metrale_pack::gpu::DevicePtr;
    let p = DevicePtr { addr: 64, bytes: 4 };
    let per_row = if kernel.spec.name.ends_with("_g128") {
        kp / 128
    } else {
        1
    };
    let outputs = [
        A::P(vec![0xAB; m * kp]),
        A::P(f32b(&vec![f32::NAN; m * per_row])),
    ];
    let call = kernel.call().ptr("q", p).ptr("sx", p);
    let call = call.dim("m", m).dim("k", k).dim("kp", kp);
    let (call, mut a): (_, Vec<A>) = match *input {
        QuantIn::Rows(x) => (call.ptr("x", p), vec![A::P(f32b(x))]),
        QuantIn::Product { g, u, gs, us, act } => {
            let call = call.ptr("g", p).ptr("u", p).dim("gs", gs).dim("us", us);
            let a = vec![A::P(f32b(g)), A::P(f32b(u)), A::I(gs), A::I(us), A::I(act)];
            (call.dim("act", act), a)
        }
    };
    let l = call.finish().unwrap();
    a.extend([A::I(m), A::I(k), A::I(kp)]);
    a.extend(outputs);
    let (gx, gy, _) = l.cfg.grid;
    let block = l.cfg.block.0 as usize;
    launch(
        exe,
        kernel.spec.name,
        (gx as usize, gy as usize),
        block,
        &mut a,
    );
    let n = a.len();
    (gx as usize, buf(&a[n - 2]).to_vec(), bf32(buf(&a[n - 1])))
}

/// Row `row` of quantized codes `[.., kp]` and their scales (`want.1.len()` a row) equal the
/// twin's `want`, bit for bit.
fn same_codes(q: &[u8], sx: &[f32], kp: usize, row: usize, want: (Vec<u8>, Vec<f32>), what: &str) {
    let per = want.1.len();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let got = &sx[row * per..(row + 1) * per];
    assert_eq!(bits(got), bits(&want.1), "{what} row {row}: scales");
    let codes = &q[row * kp..(row + 1) * kp];
    assert!(
        codes == want.0,
        "{what} row {row}: codes differ from the twin's"
    );
}

/// The W8A8 decode GEMV reproduces the W8A8 GEMM bit for bit (the fixed path's batch
/// invariance), at 1, 5 and 16 rows, on a k that leaves a partial unrolled step; both match the
/// reference. On the emulator each MMA output is a function of its own operands, so equal bits
/// here mean equal operands, positions and k order per output.
#[test]
fn w8a8_decode_gemv_reproduces_the_gemm_bits() {
    use metrale_pack::gpu::table::spec;
    let Some(exe) = emulator() else { return };
    let mut r = Rand(29);
    let (n, k) = (75usize, 1344usize);
    let c = w8a8_case(&mut r, n, k, 16);
    let (w, swf, kp, q, sx) = (&c.w, &c.swf, c.kp, &c.q, &c.sx);
    assert_ne!(kp % (32 * 8), 0, "the test wants a partial unrolled step");
    for m in [1usize, 5, 16] {
        let run = |name: &str, grid: (usize, usize)| -> Vec<f32> {
            let mut a = w8a8_args(&c, 0..m, n);
            let threads = spec("ffn_w8a8", name).unwrap().grid.threads;
            launch(exe, name, grid, threads, &mut a);
            bf32(buf(&a[5]))
        };
        let gemm = run("w8a8_gemm", (n.div_ceil(128), m.div_ceil(64)));
        let gemv = run("w8a8_gemv", (n.div_ceil(32), 1));
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&gemv),
            bits(&gemm),
            "m={m}: the GEMV's bits differ from the GEMM's"
        );
        let want = rows64(m, n, |i, row| {
            reference::w8a8_row(&q[i * kp..(i + 1) * kp], sx[i], w, swf, n, kp, row)
        });
        let err = rel_err(&gemv, &want);
        assert!(err < 2e-6, "w8a8_gemv m={m}: {err}");
    }
}

/// The sm_90a W8A8 GEMMs on the emulator (the TMA boxes and mbarrier phases of the
/// warp-specialized prefill GEMM on its persistent grid, the decode tiling's cp.async copies,
/// descriptors, the 128-byte swizzle, the warpgroup's output positions, the per-stage partial
/// sums): against the reference within
/// 2e-6 on 130 rows (two m tiles), on an n that leaves a partial tile; the decode tiling
/// (`w8a8_wgmma_m64`) gives the prefill tiling's bits on 64 rows, and a row alone through it
/// gives that row's bits inside the 130 (tile positions 0, 63 and 129 - 128). Says nothing about
/// the device's wgmma numerics, only that the kernels put each operand where the ISA says the
/// wgmma reads it and add the stages in order.
#[test]
fn w8a8_wgmma_matches_the_reference_and_is_batch_invariant() {
    use metrale_pack::gpu::table::spec;
    let Some(exe) = emulator() else { return };
    let mut r = Rand(31);
    // k = 300 pads to kp = 384 (the layout's 128 alignment): three stages, zeros after 300.
    // n = 134: rows of y 536 bytes apart, so the storers also take their 4-byte path.
    let (n, k, mtot) = (134usize, 300usize, 130usize);
    let c = w8a8_case(&mut r, n, k, mtot);
    let (w, swf, kp, q, sx) = (&c.w, &c.swf, c.kp, &c.q, &c.sx);
    assert_eq!(kp, 384);
    let run = |name: &str, rows: std::ops::Range<usize>| -> Vec<u32> {
        let sp = spec("ffn_w8a8_wgmma", name).unwrap();
        let m = rows.len();
        let mut a = w8a8_args(&c, rows, n);
        let grid = if name == "w8a8_wgmma" {
            // The pointers become the table's tensor maps; a persistent grid of one block fewer
            // than the tiles, so block 0 takes two tiles (its stage slots and barrier phases
            // carry over from one tile to the next).
            for (i, rule) in [(0, &sp.tmaps[0]), (3, &sp.tmaps[1])] {
                let rows = if rule.rows == "m" { m } else { n };
                let b = buf(&a[i]).to_vec();
                a[i] = A::T(b, kp, rows, rule.box_rows, rule.box_bytes);
            }
            assert!(sp.grid.persistent);
            let tiles = m.div_ceil(sp.tmaps[0].box_rows) * n.div_ceil(sp.tmaps[1].box_rows);
            assert!(tiles >= 2);
            (tiles - 1, 1)
        } else {
            (1, n.div_ceil(64))
        };
        launch(exe, name, grid, sp.grid.threads, &mut a);
        bf32(buf(&a[5])).iter().map(|f| f.to_bits()).collect()
    };
    let all = run("w8a8_wgmma", 0..mtot);
    let want = rows64(mtot, n, |i, row| {
        reference::w8a8_row(&q[i * kp..(i + 1) * kp], sx[i], w, swf, n, kp, row)
    });
    let got: Vec<f32> = all.iter().map(|&b| f32::from_bits(b)).collect();
    let err = rel_err(&got, &want);
    assert!(err < 2e-6, "w8a8_wgmma m={mtot}: {err}");
    assert_eq!(
        run("w8a8_wgmma_m64", 0..64),
        all[..64 * n],
        "the decode tiling's bits differ from the prefill tiling's"
    );
    for row in [0usize, 63, 129] {
        assert_eq!(
            run("w8a8_wgmma_m64", row..row + 1),
            all[row * n..(row + 1) * n],
            "row {row}: alone differs from inside the batch"
        );
    }
}

/// The FP8 activation quantizer on the grid the kernel table gives it: a decode row spread over
/// kp / 1024 blocks (every block takes the whole row's amax) and one block per row past 16 rows,
/// bit for bit the CPU twin's codes and scales; rows with an outlier, a zero row, and values that
/// land on E4M3 rounding ties and subnormals.
#[test]
fn fp8_activation_quantizer_matches_its_twin_on_every_grid() {
    use metrale_pack::gpu::host::HostBackend;
    use metrale_pack::gpu::table::Kernels;
    let Some(exe) = emulator() else { return };
    let kk = Kernels::resolve(&HostBackend::new());
    let mut r = Rand(41);
    for (m, k, kp) in [
        (1usize, 3000usize, 3072usize),
        (3, 3000, 3072),
        (17, 3000, 3072),
        (17, 16500, 16512),
    ] {
        let mut x = r.vec(m * k, 1.0);
        x[7] = 300.0; // row 0: an outlier sets the scale; many values quantize to subnormals
        if m > 1 {
            x[k..2 * k].fill(0.0); // row 1: all zero (scale 0, codes 0)
        }
        let (gx, q, sx) = run_quantizer(exe, kk.quant_fp8_row, &QuantIn::Rows(&x), m, k, kp);
        assert_eq!(gx, if m <= 16 { 3 } else { 1 }, "m={m}");
        for row in 0..m {
            let (want_q, want_s) = reference::quantize_row_fp8(&x[row * k..(row + 1) * k], kp);
            same_codes(&q, &sx, kp, row, (want_q, vec![want_s]), &format!("m={m}"));
        }
    }
}

/// The fused activation quantizer of the W8A8 down projection (`quantize_act_mul_fp8_row`): for
/// SiLU and GELU, on the table's grids (a decode row over kp / 1024 blocks, one block per row past
/// 16 rows), gate and up read with their own row strides, bit for bit the twin's codes and scales
/// of the twin's product (`silu_mul` / `gelu_mul` then `quantize_row_fp8`). The emulator's expf
/// and tanhf are the C library's, as Rust's f32 `exp` and `tanh` here; on the device, gpu-check
/// compares the fused codes with act_mul then quantize_act_fp8_row bit for bit.
#[test]
fn fused_activation_quantizer_matches_act_mul_then_quantize() {
    use metrale_pack::gpu::host::HostBackend;
    use metrale_pack::gpu::table::Kernels;
    let Some(exe) = emulator() else { return };
    let kk = Kernels::resolve(&HostBackend::new());
    let mut r = Rand(43);
    let (k, kp, gs, us) = (2100usize, 2176usize, 2110usize, 2200usize);
    for (act, f) in [
        (0usize, reference::silu_mul as fn(f32, f32) -> f32),
        (1, reference::gelu_mul),
    ] {
        for m in [1usize, 17] {
            let (g, u) = (r.vec(m * gs, 3.0), r.vec(m * us, 1.0));
            let input = QuantIn::Product {
                g: &g,
                u: &u,
                gs,
                us,
                act,
            };
            let (gx, q, sx) = run_quantizer(exe, kk.quant_fp8_act, &input, m, k, kp);
            assert_eq!(gx, if m <= 16 { 3 } else { 1 }, "m={m}");
            for row in 0..m {
                let h: Vec<f32> = (0..k)
                    .map(|i| f(g[row * gs + i], u[row * us + i]))
                    .collect();
                let (want_q, want_s) = reference::quantize_row_fp8(&h, kp);
                let what = format!("act {act} m={m}");
                same_codes(&q, &sx, kp, row, (want_q, vec![want_s]), &what);
            }
        }
    }
}

/// The FP8 arm's W8A8 prefill on the emulator: the per-group quantizers on the table's grid
/// (plain and fused with the SiLU product; zero groups, a partial last group, padding) bit for
/// bit the twin's `quantize_row_fp8_g128`, then `fp8_wgmma` over a block-scaled `fp8` weight
/// (two scale-block rows, a partial n tile, a persistent grid of fewer blocks than tiles) within
/// 2e-6 of the f64 twin `fp8_w8a8_block_row`.
#[test]
fn fp8_block_w8a8_quantizers_and_gemm_match_their_twins() {
    use metrale_pack::gpu::host::HostBackend;
    use metrale_pack::gpu::table::Kernels;
    let Some(exe) = emulator() else { return };
    let kk = Kernels::resolve(&HostBackend::new());
    let mut r = Rand(47);
    let (m, n, k) = (130usize, 200usize, 400usize);
    let e = layouts::fp8::encode(&r.vec(n * k, 0.05), n, k);
    let (w, s, np, kp) = (&e.parts[0].1, bf32(&e.parts[1].1), e.padded[0], e.padded[1]);
    assert_eq!((np, kp), (256, 512));
    let mut x = r.vec(m * k, 1.0);
    x[k..k + 128].fill(0.0); // row 1, group 0: all zero (scale 0)
    // The plain quantizer.
    let (_, q, sx) = run_quantizer(exe, kk.quant_fp8_g128, &QuantIn::Rows(&x), m, k, kp);
    let g = kp / 128;
    for row in 0..m {
        let want = reference::quantize_row_fp8_g128(&x[row * k..(row + 1) * k], kp);
        same_codes(&q, &sx, kp, row, want, "g128");
    }
    // The fused quantizer over SiLU(gate) * up, gate and up with their own strides.
    let (gs, us) = (k + 8, k + 16);
    let (gt, up) = (r.vec(3 * gs, 3.0), r.vec(3 * us, 1.0));
    let input = QuantIn::Product {
        g: &gt,
        u: &up,
        gs,
        us,
        act: 0,
    };
    let (_, fq, fsx) = run_quantizer(exe, kk.quant_fp8_act_g128, &input, 3, k, kp);
    for row in 0..3 {
        let h: Vec<f32> = (0..k)
            .map(|i| reference::silu_mul(gt[row * gs + i], up[row * us + i]))
            .collect();
        let want = reference::quantize_row_fp8_g128(&h, kp);
        same_codes(&fq, &fsx, kp, row, want, "fused g128");
    }
    // The GEMM over the plain quantizer's output.
    let sp = metrale_pack::gpu::table::spec("ffn_w8a8_wgmma", "fp8_wgmma").unwrap();
    let (bm, bn) = (sp.tmaps[0].box_rows, sp.tmaps[1].box_rows);
    let tiles = m.div_ceil(bm) * n.div_ceil(bn);
    let mut a = [
        A::T(q.clone(), kp, m, bm, 128),
        A::P(f32b(&sx)),
        A::I(m),
        A::T(w.clone(), kp, n, bn, 128),
        A::P(f32b(&s)),
        A::P(f32b(&vec![f32::NAN; m * n])),
        A::I(n),
        A::I(kp),
        A::I(n),
    ];
    launch(exe, "fp8_wgmma", (tiles - 1, 1), sp.grid.threads, &mut a);
    let got = bf32(buf(&a[5]));
    let want = rows64(m, n, |i, row| {
        reference::fp8_w8a8_block_row(
            &q[i * kp..(i + 1) * kp],
            &sx[i * g..(i + 1) * g],
            w,
            &s,
            n,
            kp,
            row,
        )
    });
    let err = rel_err(&got, &want);
    assert!(err < 2e-6, "fp8_wgmma: {err}");
}
