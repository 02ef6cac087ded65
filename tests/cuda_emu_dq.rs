//! The sm_90a dequantizing wgmma GEMMs and the int8 one on the C++ emulator
//! (`tests/cuda_emu/harness.rs`), on stand-ins for the bulk tensor copy, the mbarriers and the
//! bf16 and s8 wgmmas (reading shared memory through the descriptors and the 128-byte swizzle
//! as the PTX ISA defines them), each on a persistent grid of fewer blocks than tiles, with a
//! partial m tile and a partial n tile and an odd number of k stages (the two decoder warpgroups
//! take every other stage across tile boundaries): `nvfp4_wgmma` against `w4a16_gemm`'s twin
//! (`nvfp4_row` on bf16 activations), `q4k_wgmma` against `q4k_bf16_row` (the bf16 Q4_K
//! contract, its weights built by the bf16 fma stand-in), both within 2e-6 of the f64 sums;
//! `int8_wgmma` bit for bit against `q4k_mmq_int8_down_gemm`.

#[path = "cuda_emu/harness.rs"]
mod harness;
use harness::*;
use metrale_pack::converters::{bf16, layouts};
use metrale_pack::gpu::reference::{self, ActRound};
use metrale_pack::gpu::table::spec;
use metrale_pack::testing::{Rand, rel_err};

/// `x` ([m, k], k % 8 == 0) as bf16 bytes in the il8 order, and its bf16 values in column order.
fn il8(x: &[f32], k: usize) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = vec![0u8; x.len() * 2];
    for (i, &v) in x.iter().enumerate() {
        let (r, c) = (i / k, i % k);
        let p = r * k + reference::il8_pos(c);
        bytes[2 * p..2 * p + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes());
    }
    (bytes, x.iter().map(|&v| ActRound::Bf16.apply(v)).collect())
}

/// Launch a dequantizing GEMM `name` with the activation tensor map and m first, then `rest`,
/// on one block fewer than its tiles (block 0 takes two); returns the output `y`.
fn run_dq(name: &str, xb: Vec<u8>, m: usize, n: usize, k: usize, mut rest: Vec<A>) -> Vec<f32> {
    let exe = emulator().unwrap();
    let sp = spec("ffn_w8a8_wgmma", name).unwrap();
    let rule = &sp.tmaps[0];
    assert_eq!((rule.param, rule.elem), ("x", 2));
    let tiles = m.div_ceil(rule.box_rows) * n.div_ceil(128);
    assert!(sp.grid.persistent && tiles >= 3);
    let mut a = vec![A::T(xb, k * 2, m, rule.box_rows, rule.box_bytes), A::I(m)];
    a.append(&mut rest);
    launch(exe, name, (tiles - 1, 1), sp.grid.threads, &mut a);
    // The output by its parameter's place in the kernel table.
    let y = sp.params().position(|(p, _)| p == "y").unwrap();
    bf32(buf(&a[y]))
}

#[test]
fn nvfp4_wgmma_matches_the_bf16_twin() {
    if emulator().is_none() {
        return;
    }
    let mut r = Rand(61);
    // k = 288 (the arm's k % 32 == 0): kp 320, five k stages; n = 134: two n tiles (padded rows); m = 130: two m tiles.
    let (m, n, k) = (130usize, 134usize, 288usize);
    let ne = layouts::nvfp4::encode(&r.vec(n * k, 0.05), n, k);
    let (codes, scales, g, kp) = (
        &ne.parts[0].1,
        &ne.parts[1].1,
        ne.scalars[0].1,
        ne.padded[1],
    );
    assert_eq!(kp, 320);
    let me = layouts::nvfp4_mmq::from_nvfp4(codes, scales, 0.0, n, kp);
    let np = me.padded[0];
    let x = r.vec(m * k, 1.0);
    let (xb, _) = il8(&x, k);
    let rest = vec![
        A::P(me.parts[0].1.clone()),
        A::F(g),
        A::P(f32b(&vec![f32::NAN; m * n])),
        A::I(n),
        A::I(np),
        A::I(k),
        A::I(kp),
        A::I(n),
    ];
    let got = run_dq("nvfp4_wgmma", xb, m, n, k, rest);
    let want = rows64(m, n, |i, row| {
        let xr = &x[i * k..(i + 1) * k];
        reference::nvfp4_row(xr, codes, scales, g, n, k, kp, ActRound::Bf16, row);
    });
    let err = rel_err(&got, &want);
    assert!(err < 2e-6, "nvfp4_wgmma: {err}");
}

#[test]
fn q4k_wgmma_matches_the_bf16_q4k_contract() {
    if emulator().is_none() {
        return;
    }
    let mut r = Rand(62);
    // k = 712: kp 768, twelve k stages (three Q4_K blocks); n = 134; m = 130.
    let (m, n, k) = (130usize, 134usize, 712usize);
    let qe = layouts::q4k_mmq::encode_q4k(&r.vec(n * k, 0.05), n, k);
    let (w, kp) = (qe.parts[0].1.clone(), qe.padded[1]);
    assert_eq!(kp, 768);
    let x = r.vec(m * k, 1.0);
    let (xb, xr) = il8(&x, k);
    let rest = vec![
        A::P(w.clone()),
        A::P(f32b(&vec![f32::NAN; m * n])),
        A::I(n),
        A::I(k),
        A::I(kp),
        A::I(n),
    ];
    let got = run_dq("q4k_wgmma", xb, m, n, k, rest);
    let wd = reference::q4k_bf16_weights(&w, n, kp);
    let want = rows64(m, n, |i, row| {
        reference::q4k_bf16_row(&xr[i * k..(i + 1) * k], &wd, n, k, kp, row)
    });
    let err = rel_err(&got, &want);
    assert!(err < 2e-6, "q4k_wgmma: {err}");
}

#[test]
fn int8_wgmma_reproduces_the_mma_sync_int8_gemm_bits() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(63);
    let (m, n, k) = (130usize, 134usize, 300usize);
    let e8 = layouts::q4k_mmq::encode_int8(&r.vec(n * k, 0.05), n, k);
    let kp = e8.padded[1];
    let act = r.vec(m * k, 1.0);
    let (mut aq, mut sa) = (Vec::new(), Vec::new());
    for i in 0..m {
        let (q, d) = reference::requant_row_bf16_int8(&act[i * k..(i + 1) * k], kp);
        aq.extend(q);
        sa.push(d);
    }
    let args = |tmaps: bool| {
        let sp = spec("ffn_w8a8_wgmma", "int8_wgmma").unwrap();
        let (a, w) = (aq.clone(), e8.parts[0].1.clone());
        [
            if tmaps {
                A::T(a, kp, m, sp.tmaps[0].box_rows, 128)
            } else {
                A::P(a)
            },
            A::P(f32b(&sa)),
            A::I(m),
            if tmaps {
                A::T(w, kp, n, sp.tmaps[1].box_rows, 128)
            } else {
                A::P(w)
            },
            A::P(e8.parts[1].1.clone()),
            A::P(f32b(&vec![f32::NAN; m * n])),
            A::I(n),
            A::I(kp),
            A::I(n),
        ]
    };
    let mut a = args(true);
    let sp = spec("ffn_w8a8_wgmma", "int8_wgmma").unwrap();
    let tiles = m.div_ceil(sp.tmaps[0].box_rows) * n.div_ceil(sp.tmaps[1].box_rows);
    launch(exe, "int8_wgmma", (tiles - 1, 1), sp.grid.threads, &mut a);
    let mut b = args(false);
    let grid = (n.div_ceil(128), m.div_ceil(64));
    launch(exe, "q4k_mmq_int8_down_gemm", grid, 128, &mut b);
    let (got, want) = (bf32(buf(&a[5])), bf32(buf(&b[5])));
    assert!(
        got.iter().all(|v| v.is_finite()),
        "int8_wgmma left outputs unwritten"
    );
    assert!(
        got.iter()
            .zip(&want)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "int8_wgmma's bits differ from q4k_mmq_int8_down_gemm's"
    );
}
