//! An integer-quantized source weight in its own terms, as the source readers (AutoAWQ, GPTQ,
//! compressed-tensors) give it: codes, and a scale and zero point per group of a row. A
//! layout that carries integer weights takes it from here (the layout checks it and makes its
//! own groups of it); the readers name no layout.

/// An integer source's weight in its own terms: `w[r, c] = s[r, g] * (q[r, c] - z[r, g])` with
/// `g = c / group`, codes and zero points unsigned below `2^bits`.
pub struct IntSource<'a> {
    /// The source's bits per code (1 to 8).
    pub bits: u32,
    /// Values per group (`cols` for one group a row).
    pub group: usize,
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Codes `[rows, cols]`, one a byte.
    pub codes: &'a [u8],
    /// Scales `[rows, cols / group]` (F16, BF16 or F32 values, exact in f32).
    pub scales: &'a [f32],
    /// Zero points `[rows, cols / group]`.
    pub zeros: &'a [u32],
}

/// An [`IntSource`] that owns its codes, scales and zero points (what a reader unpacks).
#[derive(Clone, Debug, PartialEq)]
pub struct IntWeight {
    /// The source's bits per code (1 to 8).
    pub bits: u32,
    /// Values per group.
    pub group: usize,
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// Codes `[rows, cols]`.
    pub codes: Vec<u8>,
    /// Scales `[rows, cols / group]`.
    pub scales: Vec<f32>,
    /// Zero points `[rows, cols / group]`.
    pub zeros: Vec<u32>,
}

impl IntWeight {
    /// The weight as an [`IntSource`].
    pub fn source(&self) -> IntSource<'_> {
        IntSource {
            bits: self.bits,
            group: self.group,
            rows: self.rows,
            cols: self.cols,
            codes: &self.codes,
            scales: &self.scales,
            zeros: &self.zeros,
        }
    }
}

/// Per-group values stored `[groups, n]` (a checkpoint's scales, AutoAWQ's and GPTQ's: one
/// row a group) as `[n, groups]` (one row an output, as [`IntSource`] takes them).
pub fn by_output(v: &[f32], n: usize, groups: usize) -> Vec<f32> {
    (0..n * groups)
        .map(|i| v[(i % groups) * n + i / groups])
        .collect()
}
