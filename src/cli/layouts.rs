//! `metrale-pack layouts`: every layout a pack can hold, with what it costs and serves, measured
//! in this run: bits per weight at llama-8B's FFN shape (from the layout's own part sizes), the
//! forward kinds the arm table gives it, what it needs installed beside it, which source
//! formats it keeps, and its error on a generated layer of uniform random weights (encoded by the dry run).

use super::choose::{choices, method_name};
use anyhow::Result;
use metrale_pack::GgmlType;
use metrale_pack::converters::layouts::{Layout, Proj, q4k_mmq::DownFormat};
use metrale_pack::ffn::{arms, builds_on};
use metrale_pack::model::Model;
use metrale_pack::pack::ConvertOptions;
use metrale_pack::pack::choice;
use std::io::Write;

/// The shape bits per weight are given at: llama-8B's FFN (hidden 4096, intermediate 14336).
const HIDDEN: u64 = 4096;
const INTER: u64 = 14336;
/// The generated layer the errors are measured on (hidden, intermediate).
const SAMPLE: (usize, usize) = (512, 1536);

/// Bits per weight of `layout` over gate, up and down at [`HIDDEN`] x [`INTER`] (padding and
/// scales included).
fn bits_per_weight(layout: Layout) -> Option<f64> {
    let spec = layout.spec();
    let mut bytes = 0u64;
    for (proj, shape) in [
        (Proj::Gate, [INTER, HIDDEN]),
        (Proj::Up, [INTER, HIDDEN]),
        (Proj::Down, [HIDDEN, INTER]),
    ] {
        let padded = spec.padded_shape(proj, shape)?;
        for part in spec.parts(proj, DownFormat::Int8) {
            bytes += spec.part_bytes(part, padded, 0)?;
        }
    }
    Some(bytes as f64 * 8.0 / (3 * HIDDEN * INTER) as f64)
}

/// Print the table (errors measured on a generated layer in a temporary folder).
pub fn layouts(w: &mut impl Write) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("metrale-layouts-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let src = dir.join("sample.gguf");
    let measured = (|| -> Result<Vec<choice::LayoutCost>> {
        metrale_pack::testing::gen_model::gen_model(
            &src,
            SAMPLE.0,
            SAMPLE.1,
            1,
            GgmlType::F32,
            "llama",
        )?;
        let model = Model::open(&src)?;
        let opts = ConvertOptions {
            layouts: Some(choices()),
            ..Default::default()
        };
        Ok(choice::dry_run(&model, &opts)?.0)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let measured = measured?;
    writeln!(
        w,
        "{:<10} {:>6}  {:<37} {:<6} {:>7}  keeps",
        "layout", "bits", "serves", "needs", "error"
    )?;
    for layout in choices() {
        // Its own arms' forward kinds (the table's rows with this layout); nvfp4_t and
        // nvfp4_mmq have no rows of their own: the nvfp4 arms read them when held.
        let mut own: Vec<&str> = Vec::new();
        for a in arms().iter().filter(|a| a.layout == layout) {
            let m = method_name(a.method);
            if !own.contains(&m) {
                own.push(m);
            }
        }
        let beside = match layout {
            Layout::Nvfp4T => "prefill: nvfp4's _t GEMMs",
            Layout::Nvfp4Mmq => "prefill: nvfp4's MMQ GEMMs",
            _ => "",
        };
        if !beside.is_empty() {
            own = vec![beside];
        }
        let err = measured
            .iter()
            .find(|c| c.layout == layout)
            .map(|c| c.rel_err.iter().map(|(_, e)| *e).fold(0.0, f64::max))
            .map_or("-".into(), |e| format!("{:.2}%", e * 100.0));
        writeln!(
            w,
            "{:<10} {:>6}  {:<37} {:<6} {:>7}  {}",
            layout.tag(),
            bits_per_weight(layout).map_or("-".into(), |b| format!("{b:.2}")),
            own.join(","),
            builds_on(layout).map_or("-", Layout::tag),
            err,
            layout.spec().keeps_what()
        )?;
    }
    writeln!(
        w,
        "bits: per weight over gate, up and down at {HIDDEN} x {INTER} (padding and scales \
         included; q4k_mmq with its int8 down). serves: the forward kinds its arms serve on \
         sm_90 (decode = one row). error: the worst relative error of its three projections on \
         a generated {} x {} layer of uniform random weights, measured now. lora holds an adapter (--lora), not \
         the weights.",
        SAMPLE.0, SAMPLE.1
    )?;
    Ok(())
}
