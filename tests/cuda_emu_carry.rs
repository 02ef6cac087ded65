//! The GPU carries of checkpoint tensors into the `affine` layout on the C++ emulator
//! (`tests/cuda_emu/harness.rs`): `affine_from_gptq` writes the converter's bytes from GPTQ's
//! packed tensors at 2, 4 and 8 bits (groups of 128, and one group a row with padding), and
//! flags what the converter refuses; `affine_gather_bf16` puts act-order activations in the
//! stored column order as its twin does.

#[path = "cuda_emu/harness.rs"]
mod harness;
use harness::*;
use metrale_pack::testing::Rand;

#[test]
fn affine_from_gptq_writes_the_converters_bytes() {
    let Some(exe) = emulator() else { return };
    let mut r = Rand(41);
    // Groups of 128 in rows of 2176 (17 groups), and one group a row of 208 values (padded to
    // 256 with the row's zero point).
    for (n, k, group) in [(32usize, 2176usize, 128usize), (16, 208, 208)] {
        let x = r.vec(n * k, 0.3);
        for bits in metrale_pack::converters::gptq::BITS {
            let ([qw, qz, sc], g) = metrale_pack::testing::gptq_tensors(&x, n, k, bits, group);
            let want = metrale_pack::converters::layouts::affine::from_groups(&g);
            let kp = want.padded[1];
            let sgroup = metrale_pack::testing::affine_scheme(&want).group;
            let ordered: Vec<u8> = (0..k)
                .flat_map(|i| ((i / group) as i32).to_le_bytes())
                .collect();
            for case in 0..4 {
                let (mut sc, mut qz, mut gi) = (sc.clone(), qz.clone(), ordered.clone());
                match case {
                    1 => sc[6..8].copy_from_slice(&half::f16::INFINITY.to_le_bytes()),
                    2 => qz[0] |= ((1u16 << bits) - 1) as u8,
                    3 => gi[..4].copy_from_slice(&1i32.to_le_bytes()),
                    _ => {}
                }
                let mut a = [
                    A::P(qw.clone()),
                    A::P(qz),
                    A::P(sc),
                    A::P(gi),
                    A::I(bits as usize),
                    A::I(n),
                    A::I(k),
                    A::I(kp),
                    A::I(group),
                    A::I(sgroup),
                    A::P(vec![0xA5; want.parts[0].1.len()]),
                    A::P(vec![0xA5; want.parts[1].1.len()]),
                    A::P(vec![0; 4]),
                ];
                let grid = ((n * kp / 32).div_ceil(256), 1);
                launch(exe, "affine_from_gptq", grid, 256, &mut a);
                let what = format!("[{n}, {k}] {bits}-bit case {case}");
                let flag = u32::from_le_bytes(buf(&a[12])[..4].try_into().unwrap());
                assert_eq!(flag, [0, 1, 2, 4][case], "{what}: flag");
                if case == 0 {
                    assert!(buf(&a[10]) == want.parts[0].1, "{what}: codes");
                    assert!(buf(&a[11]) == want.parts[1].1, "{what}: scale pairs");
                }
            }
        }
    }
}

#[test]
fn affine_gather_bf16_matches_its_twin() {
    let Some(exe) = emulator() else { return };
    let (m, k) = (5usize, 2200usize);
    let x = Rand(43).vec(m * k, 1.0);
    let perm = metrale_pack::testing::act_order(k);
    let mut a = [
        A::P(x.iter().flat_map(|v| v.to_le_bytes()).collect()),
        A::P(perm.iter().flat_map(|v| v.to_le_bytes()).collect()),
        A::I(m),
        A::I(k),
        A::P(vec![0xA5; m * k * 2]),
    ];
    launch(
        exe,
        "affine_gather_bf16",
        ((m * k).div_ceil(256), 1),
        256,
        &mut a,
    );
    let want = metrale_pack::gpu::reference::affine_gather_bf16(&x, &perm, m, k);
    assert!(buf(&a[4]) == want);
}
