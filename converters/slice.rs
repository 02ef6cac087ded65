//! Byte slicing of a stored tensor by rows or columns, in whole blocks of its type, and the
//! zero padding of a tensor-parallel rank's intermediate slice (formats.md, "Tensor-parallel
//! packs"): what the pack's planner cuts and each layout pads its slices with.

/// Each rank's intermediate slice is padded with zeros to a multiple of this: the largest rule
/// the layer's weights set on their logical input width (`nvfp4`: k % 32; `fp8`: k % 16;
/// `bf16`: k % 8), so that every layout's rank layer has the same intermediate size. Zero rows
/// of gate and up give zero activations (`silu(0) = gelu(0) = 0`) and zero columns of down add
/// nothing. Beyond it each layout pads to its own blocks and tiles as for one GPU.
pub const TP_INTER_ALIGN: u64 = 32;

/// The padded width of a slice of `len` intermediate rows or columns.
pub fn padded_width(len: u64) -> u64 {
    len.div_ceil(TP_INTER_ALIGN) * TP_INTER_ALIGN
}

/// Rows `[lo, hi)` or (with `columns`) columns `[lo, hi)` of a row-major `[rows, cols]` tensor
/// stored in blocks of `be` elements and `bb` bytes along each row; `None` when a column cut
/// splits a block.
pub fn slice_bytes(
    data: &[u8],
    dims: [u64; 2],
    block: (u64, u64),
    columns: bool,
    range: [u64; 2],
) -> Option<Vec<u8>> {
    slice_padded(data, dims, block, columns, range, 0)
}

/// [`slice_bytes`] followed by `pad` zero rows or (with `columns`) zero columns, in whole
/// blocks (`None` when `pad` is not a multiple of the block). Zero bytes are zero values in
/// every type this pads (floats, FP8, E2M1 codes with zero scales, ggml blocks with d = 0).
pub fn slice_padded(
    data: &[u8],
    [rows, cols]: [u64; 2],
    (be, bb): (u64, u64),
    columns: bool,
    [lo, hi]: [u64; 2],
    pad: u64,
) -> Option<Vec<u8>> {
    let row_bytes = (cols / be).checked_mul(bb)? as usize;
    if !columns {
        let mut out = data
            .get(lo as usize * row_bytes..hi as usize * row_bytes)?
            .to_vec();
        out.resize(out.len() + pad as usize * row_bytes, 0);
        return Some(out);
    }
    if lo % be != 0 || hi % be != 0 || !pad.is_multiple_of(be) {
        return None;
    }
    let (a, b) = ((lo / be * bb) as usize, (hi / be * bb) as usize);
    let zeros = (pad / be * bb) as usize;
    let mut out = Vec::with_capacity(rows as usize * (b - a + zeros));
    for r in 0..rows as usize {
        out.extend_from_slice(data.get(r * row_bytes + a..r * row_bytes + b)?);
        out.resize(out.len() + zeros, 0);
    }
    Some(out)
}
