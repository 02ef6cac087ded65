//! `nvfp4_mmq`: the tile layout `finalize_nvfp4_mmq_load` builds for the NVFP4 MMQ prefill arm
//! (SiLU layers only). Designed for sm_90, which has no FP4 tensor cores: the kernel expands
//! each code to the int8 `kvalues_x2` value (E2M1 times 2 is an integer in -12..12) and runs
//! int8 MMA over k16 steps, one E4M3 scale per 16 along K.
//!
//! From the `nvfp4` layout of `[n, kp]`, n zero-padded to a multiple of [`TILE_N`]; one
//! contiguous [`TILE_BYTES`]-byte tile per (n-tile, k-tile), n-tile major, k-tiles in order, so a
//! CTA owning 128 output rows streams one contiguous 4.5 KiB chunk per 64-wide k step:
//! ```text
//! tile(nt, kt) = u8 scales[128][4]   // row r, group g: scale of row 128nt+r, k-group 4kt+g
//!                u8 codes[128][32]   // row r: code bytes of row 128nt+r for k in [64kt, 64kt+64)
//! ```
//! Codes keep the ModelOpt nibble order (element 2i low nibble). The global scale is the nvfp4
//! one.

use crate::converters::layouts::{Encoded, round_up};

/// Output rows per tile.
pub const TILE_N: usize = 128;
/// K elements per tile.
pub const TILE_K: usize = 64;
/// Bytes per tile: 128 x 4 scale bytes + 128 x 32 code bytes.
pub const TILE_BYTES: usize = TILE_N * (TILE_K / 16) + TILE_N * TILE_K / 2;
const _: () = assert!(TILE_BYTES == 4608);

/// Tile an `nvfp4` encoding (`codes [n, kp/2]`, `scales [n, kp/16]`, kp % 64 == 0).
pub fn from_nvfp4(codes: &[u8], scales: &[u8], global_scale: f32, n: usize, kp: usize) -> Encoded {
    assert_eq!(kp % TILE_K, 0);
    let np = round_up(n, TILE_N);
    let (nt, kt) = (np / TILE_N, kp / TILE_K);
    let mut out = vec![0u8; nt * kt * TILE_BYTES];
    for t in 0..nt {
        for s in 0..kt {
            let tile = &mut out[(t * kt + s) * TILE_BYTES..(t * kt + s + 1) * TILE_BYTES];
            let (sc, cd) = tile.split_at_mut(TILE_N * 4);
            for r in 0..TILE_N.min(n.saturating_sub(t * TILE_N)) {
                let row = t * TILE_N + r;
                sc[r * 4..r * 4 + 4]
                    .copy_from_slice(&scales[row * kp / 16 + s * 4..row * kp / 16 + s * 4 + 4]);
                cd[r * 32..r * 32 + 32]
                    .copy_from_slice(&codes[row * kp / 2 + s * 32..row * kp / 2 + s * 32 + 32]);
            }
        }
    }
    Encoded {
        parts: vec![("", out)],
        padded: [np, kp],
        scalars: vec![("global_scale", global_scale)],
    }
}

/// Undo the tiling: back to `nvfp4` bytes for the first `n` rows.
pub fn to_nvfp4(tiles: &[u8], n: usize, np: usize, kp: usize) -> (Vec<u8>, Vec<u8>) {
    let kt = kp / TILE_K;
    let mut codes = vec![0u8; n * kp / 2];
    let mut scales = vec![0u8; n * kp / 16];
    for row in 0..n.min(np) {
        let (t, r) = (row / TILE_N, row % TILE_N);
        for s in 0..kt {
            let tile = &tiles[(t * kt + s) * TILE_BYTES..];
            scales[row * kp / 16 + s * 4..row * kp / 16 + s * 4 + 4]
                .copy_from_slice(&tile[r * 4..r * 4 + 4]);
            let cd = &tile[TILE_N * 4 + r * 32..TILE_N * 4 + r * 32 + 32];
            codes[row * kp / 2 + s * 32..row * kp / 2 + s * 32 + 32].copy_from_slice(cd);
        }
    }
    (codes, scales)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tiles_round_trip_and_sit_where_the_spec_says() {
        let (n, kp) = (130, 128);
        let codes: Vec<u8> = (0..n * kp / 2).map(|i| (i * 13 + 1) as u8).collect();
        let scales: Vec<u8> = (0..n * kp / 16).map(|i| (i * 3) as u8).collect();
        let e = super::from_nvfp4(&codes, &scales, 1.0, n, kp);
        assert_eq!(e.padded, [256, 128]);
        let t = &e.parts[0].1;
        assert_eq!(t.len(), 2 * 2 * super::TILE_BYTES);
        // Tile (nt=1, kt=1), row r=1 (global row 129): scale of k-group 4..8 and codes 64..128.
        let base = 3 * super::TILE_BYTES;
        assert_eq!(t[base + 4..base + 8], scales[129 * 8 + 4..129 * 8 + 8]);
        assert_eq!(
            t[base + 512 + 32..base + 512 + 64],
            codes[129 * 64 + 32..129 * 64 + 64]
        );
        // Padding rows are zero.
        assert!(t[base + 2 * 4..base + 512].iter().all(|&b| b == 0));
        assert_eq!(super::to_nvfp4(t, n, 256, kp), (codes, scales));
    }
}
