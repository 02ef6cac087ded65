//! The IQ lattice grids as CUDA arrays, for the engine's IQ1, IQ2 and IQ3 entries (`kernels_iq.cuh`):
//! generated from the converters' grids (`converters::iq_grid`, gguf-py's tables, the one copy
//! in this crate) into the module's source (`kernels.rs`), so the kernels, their emulation and
//! the decoders read the same values. A row's values are its bytes, value `i` in byte `i`:
//! eight to a 64-bit word (IQ2), four to a 32-bit word (IQ3).

use crate::converters::iq_grid::{Grid, grid};
use crate::converters::iq_grids;
use std::fmt::Write;

/// One grid's rows as words: each value (a small integer) an int8 byte.
fn words(g: &Grid, rows: usize, cols: usize) -> Vec<u64> {
    (0..rows)
        .map(|r| {
            g.row(r)
                .iter()
                .take(cols)
                .enumerate()
                .fold(0u64, |w, (i, &v)| w | (v as i8 as u8 as u64) << (8 * i))
        })
        .collect()
}

/// The CUDA text: `ggml_iq2xxs_grid`, `ggml_iq2xs_grid`, `ggml_iq2s_grid`, `ggml_iq1s_grid`
/// (64-bit rows; IQ1's values -1, 0, 1 as int8 bytes) and `ggml_iq3xxs_grid`, `ggml_iq3s_grid`
/// (32-bit rows).
pub fn cuda_text() -> String {
    let mut s =
        String::from("// Generated from converters::iq_grid (src/layouts/ggml/grids.rs).\n");
    let tables: [(&str, &'static iq_grids::GridData, bool); 6] = [
        ("ggml_iq2xxs_grid", &iq_grids::IQ2_XXS, true),
        ("ggml_iq2xs_grid", &iq_grids::IQ2_XS, true),
        ("ggml_iq2s_grid", &iq_grids::IQ2_S, true),
        ("ggml_iq3xxs_grid", &iq_grids::IQ3_XXS, false),
        ("ggml_iq3s_grid", &iq_grids::IQ3_S, false),
        ("ggml_iq1s_grid", &iq_grids::IQ1_S, true),
    ];
    for (name, data, wide) in tables {
        let w = words(grid(data), data.rows, data.cols);
        let ty = if wide {
            "unsigned long long"
        } else {
            "unsigned int"
        };
        let _ = write!(s, "__device__ const {ty} {name}[{}] = {{", w.len());
        for (i, v) in w.iter().enumerate() {
            if i % 8 == 0 {
                s.push_str("\n   ");
            }
            let _ = if wide {
                write!(s, " 0x{v:016x}ull,")
            } else {
                write!(s, " 0x{v:08x}u,")
            };
        }
        s.push_str("\n};\n");
    }
    s
}

#[cfg(test)]
mod tests {
    /// Each grid row's bytes are its values (IQ2/IQ3: positive, below 64; IQ1: -1, 0, 1), so an
    /// int8 lane holds them.
    #[test]
    fn the_cuda_grids_hold_the_converters_values() {
        let t = super::cuda_text();
        assert!(t.contains("ggml_iq2xxs_grid[256]") && t.contains("ggml_iq2s_grid[1024]"));
        assert!(t.contains("ggml_iq3xxs_grid[256]") && t.contains("ggml_iq3s_grid[512]"));
        assert!(t.contains("ggml_iq1s_grid[2048]"));
        let g1 = crate::converters::iq_grid::grid(&crate::converters::iq_grids::IQ1_S);
        for (r, &x) in super::words(g1, 2048, 8).iter().enumerate() {
            for (i, &v) in g1.row(r).iter().enumerate() {
                assert_eq!((x >> (8 * i)) as u8 as i8 as f32, v);
            }
        }
        let g = crate::converters::iq_grid::grid(&crate::converters::iq_grids::IQ3_S);
        let w = super::words(g, 512, 4);
        for (r, &x) in w.iter().enumerate() {
            for (i, &v) in g.row(r).iter().enumerate() {
                assert_eq!((x >> (8 * i)) as u8 as f32, v);
                assert!(v > 0.0 && v < 64.0);
            }
        }
    }
}
