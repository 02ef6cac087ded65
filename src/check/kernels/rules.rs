//! `blob_rules` (the loader's check of the copied blobs' element rules): for every rule, on
//! elements as many as the shape's gate weight has groups of 16, clean and with bad elements
//! planted at random places, the first bad index equal to the twin's, bit for bit.

use super::*;
use crate::gpu::reference::ElementRule;

/// Valid bytes of `n` elements of `rule` (random scales; zero points every code in turn).
fn valid(rule: ElementRule, n: usize, rng: &mut Rand) -> Vec<u8> {
    let half = |v: f32| crate::converters::f16::from_f32(v).to_le_bytes();
    let s = rng.vec(n, 1.0);
    let mut p = Vec::with_capacity(n * rule.elem_bytes());
    for (i, &s) in s.iter().enumerate() {
        let z = (i % (rule.top() + 1)) as f32;
        match rule {
            ElementRule::Halves => p.extend(half(s)),
            ElementRule::ZeroPairs { .. } => p.extend([half(s), half(z)].concat()),
            ElementRule::ZeroPairsF32 { .. } => {
                p.extend([s.to_le_bytes(), z.to_le_bytes()].concat())
            }
            ElementRule::F32 => p.extend(s.to_le_bytes()),
            ElementRule::E4m3 => p.push((i % 127) as u8),
        }
    }
    p
}

/// One bad element of `rule` (a NaN or infinity, a zero point past the codes or not whole).
fn bad(rule: ElementRule, which: u64) -> Vec<u8> {
    let half = |v: f32| crate::converters::f16::from_f32(v).to_le_bytes();
    match (rule, which % 2) {
        (ElementRule::Halves, 0) => half(f32::NAN).to_vec(),
        (ElementRule::Halves, _) => half(f32::INFINITY).to_vec(),
        (ElementRule::ZeroPairs { bits }, 0) => [half(1.0), half((1u32 << bits) as f32)].concat(),
        (ElementRule::ZeroPairs { .. }, _) => [half(1.0), half(0.5)].concat(),
        (ElementRule::ZeroPairsF32 { .. }, 0) => {
            [f32::NAN.to_le_bytes(), 0f32.to_le_bytes()].concat()
        }
        (ElementRule::ZeroPairsF32 { .. }, _) => {
            [1f32.to_le_bytes(), (-1f32).to_le_bytes()].concat()
        }
        (ElementRule::F32, 0) => f32::NAN.to_le_bytes().to_vec(),
        (ElementRule::F32, _) => f32::NEG_INFINITY.to_le_bytes().to_vec(),
        (ElementRule::E4m3, 0) => vec![0x7f],
        (ElementRule::E4m3, _) => vec![0xff],
    }
}

/// The rows: each rule clean (no index found) and with three bad elements planted (the lowest
/// found), slot 1 of 3 written and no other.
pub(super) fn rules_rows(c: &Case, rows: &mut Vec<Row>, rng: &mut Rand) -> GpuResult<()> {
    let k = c.kk.blob_rules;
    if !k.ok() {
        return Ok(());
    }
    let b = c.b.as_ref();
    let n = c.n * c.k / 16;
    for rule in [
        ElementRule::Halves,
        ElementRule::ZeroPairs { bits: 4 },
        ElementRule::ZeroPairs { bits: 8 },
        ElementRule::ZeroPairsF32 { bits: 4 },
        ElementRule::F32,
        ElementRule::E4m3,
    ] {
        for planted in [false, true] {
            let mut p = valid(rule, n, rng);
            if planted {
                for w in 0..3 {
                    let i = (rng.next_u64() % n as u64) as usize;
                    let e = rule.elem_bytes();
                    p[i * e..(i + 1) * e].copy_from_slice(&bad(rule, w));
                }
            }
            let want = reference::blob_rules(&p, n, rule);
            let (pd, out) = (alloc_upload(b, &p)?, b.alloc(12)?);
            b.fill(out, 0xff)?;
            let call = k
                .call()
                .ptr("p", pd)
                .dim("n", n)
                .dim("kind", rule.kind())
                .dim("top", rule.top())
                .ptr("bad", out)
                .dim("slot", 1);
            let r = c.launch(call).and_then(|()| {
                let mut got = vec![0u8; 12];
                b.download(out, &mut got)?;
                Ok(got)
            });
            b.free(pd);
            b.free(out);
            let got = r?;
            let same = got[4..8] == want.to_le_bytes()
                && got[..4] == [0xff; 4]
                && got[8..] == [0xff; 4]
                && (want == u32::MAX) != planted;
            let what = if planted { "3 planted" } else { "clean" };
            c.bits(rows, &format!("blob_rules {rule:?} {what}"), 0, same);
        }
    }
    Ok(())
}
