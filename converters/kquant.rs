//! Shared pieces of ggml's K-quant reference quantizers (ggml-quants.c): `nearest_int`,
//! `make_qkx2_quants` and `get_scale_min_k4`. Written from the algorithm as ggml documents it,
//! in ggml's float32 operation order (no fused multiply-add: x86 builds of ggml-quants.c are
//! compiled without `-march`, so the compiler does not contract; Rust never contracts).

/// Super-block size of the K-quants.
pub const QK_K: usize = 256;

/// Round to nearest, ties to even, by the 12582912 (1.5 * 2^23) magic add. Valid for
/// |x| <= 4194303, as ggml asserts.
#[inline]
pub fn nearest_int(f: f32) -> i32 {
    let val = f + 12582912.0f32;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// ggml `make_qkx2_quants`: find scale and min for `x` with `nmax + 1` levels, searching
/// `nstep + 1` candidate inverse scales around `nmax / (max - min)`. Fills `l` with the codes;
/// returns `(scale, the_min)` where `the_min` is the negated (non-negative) offset.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx2_quants<const N: usize>(
    nmax: i32,
    x: &[f32; N],
    weights: &[f32; N],
    l: &mut [u8; N],
    laux: &mut [u8; N],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = N;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        best_mad += weights[i] * diff;
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let lf = q as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                let diff = if use_mad { diff.abs() } else { diff * diff };
                mad += weights[i] * diff;
            }
            if mad < best_mad {
                l.copy_from_slice(laux);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K
/// `scales[12]` array.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(2.4999), 2);
        assert_eq!(nearest_int(-7.6), -8);
    }

    #[test]
    fn scale_min_k4_unpacks_high_bits() {
        let mut q = [0u8; 12];
        q[0] = 0b11_000001; // sc0 = 1, high bits of sc4 = 3
        q[4] = 0b10_000010; // m0 = 2, high bits of m4 = 2
        q[8] = 0x5A; // sc4 low = 0xA, m4 low = 0x5
        assert_eq!(get_scale_min_k4(0, &q), (1, 2));
        assert_eq!(get_scale_min_k4(4, &q), (0xA | (3 << 4), 0x5 | (2 << 4)));
    }
}
