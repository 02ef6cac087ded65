//! The CPU twin of the block-format engine's GEMV (`ggml_gemv`, `kernels.cu`): part of the
//! kernels' numerics contract (`gpu::reference`, mounted there and re-exported). Bit for bit:
//! each block's dot product is the kernel's integer sum and the same f32 operations in the
//! same order, each lane's sum over its blocks in the kernel's order, then the same butterfly.

use crate::GgmlType;
use crate::converters::bnb::{NF4_HI, NF4_LO};
use crate::converters::iq_grid::{Grid, grid, ksigns};
use crate::converters::iq_grids;
use crate::converters::iq4::KVALUES;
use crate::converters::kquant::get_scale_min_k4;
use crate::converters::mxfp4::{KVALUES_X2, e8m0_to_f32_half};
use crate::converters::nvfp4::ue4m3_to_f32_half;
use crate::gpu::reference::f16_at;
use crate::gpu::sizes::*;
use rayon::prelude::*;

/// The int8 dot product of 4 code bytes with 4 activation bytes (one `dp4a`).
fn dp4(w: u32, a: &[u8]) -> i32 {
    (0..4)
        .map(|i| (w >> (8 * i)) as u8 as i8 as i32 * a[i] as i8 as i32)
        .sum()
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Four 4-bit codes with their fifth bits: bits `bit0 ..` of `qh` into bit 4 of each byte.
fn with_high(v: u32, qh: u32, bit0: u32) -> u32 {
    let h = qh >> bit0;
    v | ((h & 1) << 4) | ((h & 2) << 11) | ((h & 4) << 18) | ((h & 8) << 25)
}

/// The nibble sum of a 16-byte Q4_0/Q4_1 code array against a q8_1 block's 32 codes, with the
/// fifth bits of Q5_0/Q5_1 where `qh` is given.
fn nibble_sum(qs: &[u8], aq: &[u8], qh: Option<u32>) -> i32 {
    let mut s = 0;
    for i in 0..4 {
        let v = u32_at(&qs[4 * i..]);
        let (mut lo, mut hi) = (v & 0x0F0F_0F0F, (v >> 4) & 0x0F0F_0F0F);
        if let Some(qh) = qh {
            lo = with_high(lo, qh, 4 * i as u32);
            hi = with_high(hi, qh, 16 + 4 * i as u32);
        }
        s += dp4(lo, &aq[4 * i..]);
        s += dp4(hi, &aq[16 + 4 * i..]);
    }
    s
}

/// Four 4-bit indices (a byte each of `v`) through a 16-entry table into four int8 lanes.
fn table4(v: u32, table: &[i8; 16]) -> u32 {
    (0..4).fold(0, |acc, i| {
        acc | (table[((v >> (8 * i)) & 15) as usize] as u8 as u32) << (8 * i)
    })
}

/// The integer dot product of 16 index bytes (low nibbles: values 0..15, high: 16..31)
/// through `table` with a q8_1 block's 32 codes.
fn table_dot(qs: &[u8], aq: &[u8], table: &[i8; 16]) -> i32 {
    (0..4)
        .map(|i| {
            let v = u32_at(&qs[4 * i..]);
            dp4(table4(v & 0x0F0F_0F0F, table), &aq[4 * i..])
                + dp4(table4((v >> 4) & 0x0F0F_0F0F, table), &aq[16 + 4 * i..])
        })
        .sum()
}

/// `(d sc) (da s) - (dmin m) sa` of sub-block `j` of a Q4_K/Q5_K super-block.
fn kquant_sub(blk: &[u8], j: usize, s: i32, a: &Act) -> f32 {
    let (sc, m) = get_scale_min_k4(j, blk[4..16].try_into().unwrap());
    let dsc = f16_at(blk) * sc as f32;
    let dm = f16_at(&blk[2..]) * m as f32;
    dsc * (a.da * s as f32) + -(dm * a.sa)
}

/// One q8_1 activation block: its 32 codes, its scale and the f16 sum of its unquantized
/// values.
struct Act<'a> {
    aq: &'a [u8],
    da: f32,
    sa: f32,
}

/// Q4_0 (`ggml_dot<2>`): `d * (da * s + -(8 * sa))`.
fn dot_q4_0(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[b * GGML_Q4_0_BYTES..];
    let s = nibble_sum(&blk[2..], a.aq, None);
    f16_at(blk) * (a.da * s as f32 + -(8.0 * a.sa))
}

/// Q4_1 (`ggml_dot<3>`): `(d * da) * s + m * sa`.
fn dot_q4_1(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[b * GGML_Q4_1_BYTES..];
    let s = nibble_sum(&blk[4..], a.aq, None);
    (f16_at(blk) * a.da) * s as f32 + f16_at(&blk[2..]) * a.sa
}

/// Q5_0 (`ggml_dot<6>`): `d * (da * s + -(16 * sa))`.
fn dot_q5_0(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[b * GGML_Q5_0_BYTES..];
    let s = nibble_sum(&blk[6..], a.aq, Some(u32_at(&blk[2..])));
    f16_at(blk) * (a.da * s as f32 + -(16.0 * a.sa))
}

/// Q5_1 (`ggml_dot<7>`): `(d * da) * s + m * sa`.
fn dot_q5_1(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[b * GGML_Q5_1_BYTES..];
    let s = nibble_sum(&blk[8..], a.aq, Some(u32_at(&blk[4..])));
    (f16_at(blk) * a.da) * s as f32 + f16_at(&blk[2..]) * a.sa
}

/// Q8_0 (`ggml_dot<8>`): `d * (da * s)`.
fn dot_q8_0(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[b * GGML_Q8_0_BYTES..];
    let s: i32 = (0..8)
        .map(|i| dp4(u32_at(&blk[2 + 4 * i..]), &a.aq[4 * i..]))
        .sum();
    f16_at(blk) * (a.da * s as f32)
}

/// Q2_K (`ggml_dot<10>`): `(d * da) * sum sc s + -((dmin * da) * sum m u)`.
fn dot_q2_k(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_Q2K_BYTES..];
    let (h, t) = ((b & 7) >> 2, b & 3);
    let qs = &blk[16 + 32 * h..];
    let (mut s, mut u) = ([0i32; 2], [0i32; 2]);
    for i in 0..8 {
        let q = (u32_at(&qs[4 * i..]) >> (2 * t)) & 0x0303_0303;
        s[i >> 2] += dp4(q, &a.aq[4 * i..]);
        u[i >> 2] += dp4(0x0101_0101, &a.aq[4 * i..]);
    }
    let (sc0, sc1) = (blk[8 * h + 2 * t] as i32, blk[8 * h + 2 * t + 1] as i32);
    let sd = (sc0 & 15) * s[0] + (sc1 & 15) * s[1];
    let sm = (sc0 >> 4) * u[0] + (sc1 >> 4) * u[1];
    (f16_at(&blk[80..]) * a.da) * sd as f32 + -((f16_at(&blk[82..]) * a.da) * sm as f32)
}

/// Q3_K's 6-bit sub-block scale `is`, less 32 (`ggml_q3k_scale`).
fn q3k_scale(sc: &[u8], is: usize) -> i32 {
    let lo = if is < 8 { sc[is] & 15 } else { sc[is - 8] >> 4 };
    let hi = (sc[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
    (lo | (hi << 4)) as i32 - 32
}

/// Q3_K (`ggml_dot<11>`): `d * (da * (sc0 s0 + sc1 s1))`, the codes less 4 (where the high bit
/// is clear) in the integers.
fn dot_q3_k(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_Q3K_BYTES..];
    let j = b & 7;
    let (h, t) = (j >> 2, j & 3);
    let qs = &blk[32 + 32 * h..];
    let mut s = [0i32; 2];
    for i in 0..8 {
        let lo = (u32_at(&qs[4 * i..]) >> (2 * t)) & 0x0303_0303;
        let hb = ((u32_at(&blk[4 * i..]) >> j) & 0x0101_0101) << 2;
        s[i >> 2] += dp4(lo | hb, &a.aq[4 * i..]) + dp4(0xFCFC_FCFC, &a.aq[4 * i..]);
    }
    let (sc0, sc1) = (
        q3k_scale(&blk[96..], 2 * j),
        q3k_scale(&blk[96..], 2 * j + 1),
    );
    f16_at(&blk[108..]) * (a.da * (sc0 * s[0] + sc1 * s[1]) as f32)
}

/// Q4_K (`ggml_dot<12>`) and Q5_K (`ggml_dot<13>`): sub-block `b % 8` through [`kquant_sub`].
fn dot_q45_k(w: &[u8], b: usize, a: &Act, q5: bool) -> f32 {
    let bytes = if q5 { GGML_Q5K_BYTES } else { Q4K_BYTES };
    let blk = &w[(b >> 3) * bytes..];
    let j = b & 7;
    let qs = &blk[if q5 { 48 } else { 16 } + 32 * (j >> 1)..];
    let s: i32 = (0..8)
        .map(|i| {
            let lo = (u32_at(&qs[4 * i..]) >> (4 * (j & 1))) & 0x0F0F_0F0F;
            let hi = if q5 {
                ((u32_at(&blk[16 + 4 * i..]) >> j) & 0x0101_0101) << 4
            } else {
                0
            };
            dp4(lo | hi, &a.aq[4 * i..])
        })
        .sum();
    kquant_sub(blk, j, s, a)
}

/// Q6_K (`ggml_dot<14>`): `d * (da * (sc0 s0 + sc1 s1))`, the codes less 32 in the integers.
fn dot_q6_k(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_Q6K_BYTES..];
    let (h, t) = ((b & 7) >> 2, b & 3);
    let ql = &blk[64 * h + 32 * (t & 1)..];
    let qh = &blk[128 + 32 * h..];
    let mut s = [0i32; 2];
    for i in 0..8 {
        let lo = (u32_at(&ql[4 * i..]) >> (4 * (t >> 1))) & 0x0F0F_0F0F;
        let hi = ((u32_at(&qh[4 * i..]) >> (2 * t)) & 0x0303_0303) << 4;
        s[i >> 2] += dp4(lo | hi, &a.aq[4 * i..]) + dp4(0xE0E0_E0E0, &a.aq[4 * i..]);
    }
    let sc0 = blk[192 + 8 * h + 2 * t] as i8 as i32;
    let sc1 = blk[192 + 8 * h + 2 * t + 1] as i8 as i32;
    f16_at(&blk[208..]) * (a.da * (sc0 * s[0] + sc1 * s[1]) as f32)
}

/// IQ4_NL (`ggml_dot<20>`): `d * (da * s)`, the codes through `kvalues_iq4nl`.
fn dot_iq4_nl(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[b * GGML_IQ4_NL_BYTES..];
    f16_at(blk) * (a.da * table_dot(&blk[2..], a.aq, &KVALUES) as f32)
}

/// IQ4_XS (`ggml_dot<23>`): `d * (da * ((ls - 32) * s))`.
fn dot_iq4_xs(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ4_XS_BYTES..];
    let j = b & 7;
    let s = table_dot(&blk[8 + 16 * j..], a.aq, &KVALUES);
    let sh = u16::from_le_bytes([blk[2], blk[3]]) as u32;
    let lo = (blk[4 + j / 2] >> (4 * (j & 1))) as u32 & 15;
    let ls = (lo | ((sh >> (2 * j)) & 3) << 4) as i32 - 32;
    f16_at(blk) * (a.da * (ls * s) as f32)
}

/// MXFP4 (`ggml_dot<39>`): `2^(e - 128) * (da * s)`, the codes through E2M1 doubled.
fn dot_mxfp4(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[b * GGML_MXFP4_BYTES..];
    let s = table_dot(&blk[1..], a.aq, &KVALUES_X2);
    e8m0_to_f32_half(blk[0]) * (a.da * s as f32)
}

/// NF4 (`ggml_dot<128>`, the engine's own type): `(absmax * 2^-13) * (da * (128 hi + lo))`,
/// `hi` and `lo` the codes' dot products through `NF4_HI` and `NF4_LO` (half `b % 2` of
/// 64-value block `b / 2`).
fn dot_nf4(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 1) * GGML_NF4_BYTES..];
    let qs = &blk[4 + 16 * (b & 1)..];
    let t = 128 * table_dot(qs, a.aq, &NF4_HI) + table_dot(qs, a.aq, &NF4_LO);
    let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]) * (1.0 / 8192.0);
    d * (a.da * t as f32)
}

/// NVFP4 (`ggml_dot<40>`): `da * (d0 * s0 + d1 * s1)`, `d0`, `d1` the UE4M3 scales (halved)
/// of the two 16-value sub-blocks of half `b % 2` of 64-value block `b / 2`; element `e` of
/// sub-block `k` the low (`e < 8`) or high nibble of `qs[8 k + e % 8]`, through E2M1 doubled.
fn dot_nvfp4(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 1) * GGML_NVFP4_BYTES..];
    let sub = |k: usize, aq: &[u8]| -> i32 {
        (0..16)
            .map(|e| {
                let q = blk[4 + 8 * k + e % 8] >> if e < 8 { 0 } else { 4 };
                KVALUES_X2[(q & 15) as usize] as i32 * aq[e] as i8 as i32
            })
            .sum()
    };
    let k0 = 2 * (b & 1);
    let (s0, s1) = (sub(k0, a.aq), sub(k0 + 1, &a.aq[16..]));
    let (d0, d1) = (ue4m3_to_f32_half(blk[k0]), ue4m3_to_f32_half(blk[k0 + 1]));
    a.da * (d0 * s0 as f32 + d1 * s1 as f32)
}

/// The integer dot product of the 32 values `(grid value) * sign` (value `e` from grid row
/// `row(e / cols)`, negated where `sign(e)`) with a q8_1 block's codes: `[s0, s1]`, the sums
/// over values 0..15 and 16..31 (`ggml_codes` of the IQ entries, `kernels_iq.cuh`).
fn grid_sums(
    g: &Grid,
    cols: usize,
    row: impl Fn(usize) -> usize,
    sign: impl Fn(usize) -> bool,
    aq: &[u8],
) -> [i32; 2] {
    let mut s = [0i32; 2];
    for e in 0..32 {
        let v = g.row(row(e / cols))[e % cols] as i32;
        s[e / 16] += if sign(e) { -v } else { v } * aq[e] as i8 as i32;
    }
    s
}

/// Bit `e % 8` of `ksigns(x >> (7 * (e / 8)))`: value `e`'s sign under four 7-bit sign indices.
fn ksign(x: u32, e: usize) -> bool {
    (ksigns(x >> (7 * (e / 8))) >> (e % 8)) & 1 == 1
}

/// IQ2_XXS (`ggml_dot<16>`): `(d * 0.125) * (da * ((2 ls + 1) (s0 + s1)))`.
fn dot_iq2_xxs(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ2_XXS_BYTES..];
    let sub = &blk[2 + 8 * (b & 7)..];
    let (aux0, aux1) = (u32_at(sub), u32_at(&sub[4..]));
    let g = grid(&iq_grids::IQ2_XXS);
    let [s0, s1] = grid_sums(
        g,
        8,
        |r| (aux0 >> (8 * r)) as usize & 0xFF,
        |e| ksign(aux1, e),
        a.aq,
    );
    let ls = (aux1 >> 28) as i32;
    (f16_at(blk) * 0.125) * (a.da * ((2 * ls + 1) * (s0 + s1)) as f32)
}

/// IQ2_XS and IQ2_S: `(d * 0.125) * (da * ((2 ls0 + 1) s0 + (2 ls1 + 1) s1))`, the scales byte
/// of sub-block `j` at `sc`.
fn iq2_scale16(blk: &[u8], sc: usize, j: usize, [s0, s1]: [i32; 2], a: &Act) -> f32 {
    let ls = blk[sc + j] as i32;
    let t = (2 * (ls & 15) + 1) * s0 + (2 * (ls >> 4) + 1) * s1;
    (f16_at(blk) * 0.125) * (a.da * t as f32)
}

/// IQ2_XS (`ggml_dot<17>`): a u16 per 8 values (9-bit grid index, 7-bit sign index).
fn dot_iq2_xs(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ2_XS_BYTES..];
    let j = b & 7;
    let x = |t: usize| u16::from_le_bytes([blk[2 + 8 * j + 2 * t], blk[3 + 8 * j + 2 * t]]) as u32;
    let g = grid(&iq_grids::IQ2_XS);
    let s = grid_sums(
        g,
        8,
        |t| (x(t) & 511) as usize,
        |e| ksign(x(e / 8) >> 9, e % 8),
        a.aq,
    );
    iq2_scale16(blk, 66, j, s, a)
}

/// IQ2_S (`ggml_dot<22>`): 10-bit grid indices (`qs`, two high bits in `qh`), a sign byte per
/// 8 values.
fn dot_iq2_s(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ2_S_BYTES..];
    let j = b & 7;
    let idx = |t: usize| {
        let gi = 4 * j + t;
        blk[2 + gi] as usize | (((blk[66 + gi / 4] >> (2 * (gi % 4))) & 3) as usize) << 8
    };
    let g = grid(&iq_grids::IQ2_S);
    let s = grid_sums(
        g,
        8,
        idx,
        |e| (blk[34 + 4 * j + e / 8] >> (e % 8)) & 1 == 1,
        a.aq,
    );
    iq2_scale16(blk, 74, j, s, a)
}

/// IQ3_XXS (`ggml_dot<18>`): `(d * 0.25) * (da * ((2 ls + 1) (s0 + s1)))`.
fn dot_iq3_xxs(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ3_XXS_BYTES..];
    let j = b & 7;
    let aux = u32_at(&blk[66 + 4 * j..]);
    let g = grid(&iq_grids::IQ3_XXS);
    let [s0, s1] = grid_sums(
        g,
        4,
        |r| blk[2 + 8 * j + r] as usize,
        |e| ksign(aux, e),
        a.aq,
    );
    let ls = (aux >> 28) as i32;
    (f16_at(blk) * 0.25) * (a.da * ((2 * ls + 1) * (s0 + s1)) as f32)
}

/// IQ3_S (`ggml_dot<21>`): `d * (da * ((1 + 2 ls) (s0 + s1)))`, 9-bit grid indices and a sign
/// bit per value.
fn dot_iq3_s(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ3_S_BYTES..];
    let j = b & 7;
    let idx = |r: usize| {
        let gi = 8 * j + r;
        blk[2 + gi] as usize | (((blk[66 + gi / 8] >> (gi % 8)) & 1) as usize) << 8
    };
    let g = grid(&iq_grids::IQ3_S);
    let [s0, s1] = grid_sums(
        g,
        4,
        idx,
        |e| (blk[74 + 4 * j + e / 8] >> (e % 8)) & 1 == 1,
        a.aq,
    );
    let ls = ((blk[106 + j / 2] >> (4 * (j & 1))) & 15) as i32;
    f16_at(blk) * (a.da * ((1 + 2 * ls) * (s0 + s1)) as f32)
}

/// The integer sums `[s0, s1]` of an IQ1 sub-block's codes `8 g + (1 or -1)` (`ggml_iq1_row`)
/// against a q8_1 block: group `l`'s grid row `row(l)` and delta sign `neg(l)`.
fn iq1_sums(row: impl Fn(usize) -> usize, neg: impl Fn(usize) -> bool, aq: &[u8]) -> [i32; 2] {
    let g = grid(&iq_grids::IQ1_S);
    let mut s = [0i32; 2];
    for e in 0..32 {
        let c = 8 * g.row(row(e / 8))[e % 8] as i32 + if neg(e / 8) { -1 } else { 1 };
        s[e / 16] += c * aq[e] as i8 as i32;
    }
    s
}

/// IQ1_S (`ggml_dot<19>`): `(d * 0.125) * (da * ((2 ls + 1) (s0 + s1)))`.
fn dot_iq1_s(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ1_S_BYTES..];
    let j = b & 7;
    let qh = u16::from_le_bytes([blk[34 + 2 * j], blk[35 + 2 * j]]) as u32;
    let idx = |l: usize| blk[2 + 4 * j + l] as usize | (((qh >> (3 * l)) & 7) as usize) << 8;
    let [s0, s1] = iq1_sums(idx, |_| qh >> 15 == 1, a.aq);
    let ls = ((qh >> 12) & 7) as i32;
    (f16_at(blk) * 0.125) * (a.da * ((2 * ls + 1) * (s0 + s1)) as f32)
}

/// IQ1_M (`ggml_dot<29>`): `(d * 0.125) * (da * ((2 ls0 + 1) s0 + (2 ls1 + 1) s1))`, `d` the f16
/// in the four scale words' top nibbles.
fn dot_iq1_m(w: &[u8], b: usize, a: &Act) -> f32 {
    let blk = &w[(b >> 3) * GGML_IQ1_M_BYTES..];
    let j = b & 7;
    let sc = |i: usize| u16::from_le_bytes([blk[48 + 2 * i], blk[49 + 2 * i]]) as u32;
    let bits = (sc(0) >> 12) | (sc(1) >> 12) << 4 | (sc(2) >> 12) << 8 | (sc(3) >> 12) << 12;
    let d = half::f16::from_bits(bits as u16).to_f32();
    let nib = |l: usize| (blk[32 + (4 * j + l) / 2] >> (4 * ((4 * j + l) & 1))) & 15;
    let idx = |l: usize| blk[4 * j + l] as usize | ((nib(l) & 7) as usize) << 8;
    let [s0, s1] = iq1_sums(idx, |l| nib(l) & 8 != 0, a.aq);
    let ls = |u: usize| ((sc(u / 4) >> (3 * (u & 3))) & 7) as i32;
    let t = (2 * ls(2 * j) + 1) * s0 + (2 * ls(2 * j + 1) + 1) * s1;
    (d * 0.125) * (a.da * t as f32)
}

/// The dot product of 32-value block `b` of weight row `w` (type `ty`) with one q8_1 block
/// `a`, as `ggml_dot<ty>` computes it: one function per type, as in the kernel.
pub fn ggml_dot(ty: GgmlType, w: &[u8], b: usize, a: &[u8]) -> f32 {
    let a = &Act {
        aq: &a[4..4 + Q8_1_ELEMS],
        da: f16_at(a),
        sa: f16_at(&a[2..]),
    };
    match ty {
        GgmlType::Q4_0 => dot_q4_0(w, b, a),
        GgmlType::Q4_1 => dot_q4_1(w, b, a),
        GgmlType::Q5_0 => dot_q5_0(w, b, a),
        GgmlType::Q5_1 => dot_q5_1(w, b, a),
        GgmlType::Q8_0 => dot_q8_0(w, b, a),
        GgmlType::Q2_K => dot_q2_k(w, b, a),
        GgmlType::Q3_K => dot_q3_k(w, b, a),
        GgmlType::Q4_K => dot_q45_k(w, b, a, false),
        GgmlType::Q5_K => dot_q45_k(w, b, a, true),
        GgmlType::Q6_K => dot_q6_k(w, b, a),
        GgmlType::IQ4_NL => dot_iq4_nl(w, b, a),
        GgmlType::IQ4_XS => dot_iq4_xs(w, b, a),
        GgmlType::MXFP4 => dot_mxfp4(w, b, a),
        GgmlType::NVFP4 => dot_nvfp4(w, b, a),
        GgmlType::IQ2_XXS => dot_iq2_xxs(w, b, a),
        GgmlType::IQ2_XS => dot_iq2_xs(w, b, a),
        GgmlType::IQ2_S => dot_iq2_s(w, b, a),
        GgmlType::IQ3_XXS => dot_iq3_xxs(w, b, a),
        GgmlType::IQ3_S => dot_iq3_s(w, b, a),
        GgmlType::IQ1_S => dot_iq1_s(w, b, a),
        GgmlType::IQ1_M => dot_iq1_m(w, b, a),
        GgmlType::NF4 => dot_nf4(w, b, a),
        _ => unreachable!("{ty:?} is not an engine type (layouts::ggml::codec::TYPES)"),
    }
}

/// One activation row (`xq`: its q8_1 blocks, `kp / 32` of them) through the engine's GEMV:
/// `y[j]` for the `n` weight rows of `w` (type `ty`, `kp` values a row), times the output scale
/// `sc` (1 where the source has none).
pub fn ggml_gemv_row(
    xq: &[u8],
    w: &[u8],
    ty: GgmlType,
    sc: f32,
    [n, kp]: [usize; 2],
    y: &mut [f32],
) {
    let nb = kp / Q8_1_ELEMS;
    let row_bytes = ty.row_bytes(kp as u64).expect("whole blocks") as usize;
    y[..n].par_iter_mut().enumerate().for_each(|(j, out)| {
        let row = &w[j * row_bytes..(j + 1) * row_bytes];
        let mut lanes = [0f32; 32];
        for b in 0..nb {
            let a = &xq[b * Q8_1_BYTES..(b + 1) * Q8_1_BYTES];
            lanes[b % 32] += ggml_dot(ty, row, b, a);
        }
        for o in [16, 8, 4, 2, 1] {
            let prev = lanes;
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = prev[l] + prev[l ^ o];
            }
        }
        *out = lanes[0] * sc;
    });
}

/// The prefill's dequantization (`ggml_dequant_bf16`): `n` rows of `kp` values of `ty` to BF16
/// `[n, kp]`, each value the converters' decode (gguf-py's, bit for bit) times the output scale
/// `sc`, rounded to nearest even.
pub fn ggml_dequant_bf16(w: &[u8], ty: GgmlType, sc: f32, n: usize, kp: usize) -> Vec<u16> {
    let mut v = vec![0f32; n * kp];
    crate::converters::decode_ggml(
        ty,
        &w[..ty.row_bytes(kp as u64).expect("whole blocks") as usize * n],
        &mut v,
    )
    .expect("whole blocks");
    v.iter()
        .map(|&x| crate::converters::bf16::from_f32(x * sc))
        .collect()
}
