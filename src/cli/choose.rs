//! `convert`'s layout choice: the source's own format kept where a layout carries it, a
//! re-quantization refused without `--allow-requantize` (with the choices and their measured
//! cost), the dry run's table, and warnings for layouts far from the source.

use anyhow::Result;
use metrale_pack::converters::layouts::Layout;
use metrale_pack::ffn::{Method, arms, builds_on};
use metrale_pack::model::{Activation, Model};
use metrale_pack::pack::choice::{self, LayoutCost};
use metrale_pack::pack::{ConvertOptions, Fidelity};
use std::io::Write;
use std::path::Path;

/// A relative error above which `convert` warns (the 2-bit layout measures 43% on SmolLM2).
pub const WARN_REL_ERR: f64 = 0.10;

/// Every layout a user can name for the dense FFN weights: the registry's but the LoRA adapter
/// (which `--lora` adds).
pub fn choices() -> Vec<Layout> {
    Layout::ALL
        .into_iter()
        .filter(|&l| l != Layout::Lora)
        .collect()
}

/// The layouts a user can choose for `model`: [`choices`] less those its activation refuses
/// (on a GELU model, those whose kernels are SiLU's only).
pub fn choices_for(model: &Model) -> Vec<Layout> {
    let gelu = model.activation == Some(Activation::Gelu);
    choices()
        .into_iter()
        .filter(|l| !gelu || l.spec().gelu_refusal().is_none())
        .collect()
}

/// Refuse a re-quantizing set: every choice's cost on the terminal, then one error line that
/// says why the set asked for (or chosen) stops, and nothing about layouts not asked for.
pub fn refuse(model: &Model, opts: &ConvertOptions, why: &str) -> Result<()> {
    let mut all = opts.clone();
    all.layouts = Some(choices_for(model));
    all.lora = None;
    // The choices go to the terminal as they are (this program's own text); the error stays
    // one line. Only layouts this model can take are measured, so an error here is the
    // source's (a non-finite weight, named by position), reported in the refusal's place.
    let (costs, carried) = choice::dry_run(model, &all)?;
    write_costs(&mut std::io::stderr().lock(), &costs, carried)?;
    let table = format!(
        "Choose with --layouts from the table above (each layout's size and its error measured \
         on layer {} against the source's own weights; bf16 keeps the weights' values)",
        model.ffn_layers.first().map_or(0, |l| l.index),
    );
    anyhow::bail!(
        "{}: {why}; stopped before writing. {table}, or pass --allow-requantize",
        model.path.display(),
    )
}

/// The forward kinds a layer holding `set` can run (a layout that builds on another,
/// [`builds_on`], installs only beside it, as the loader installs them).
pub fn served(set: &[Layout]) -> Vec<Method> {
    let installed = |l: Layout| set.contains(&l) && builds_on(l).is_none_or(|b| set.contains(&b));
    let mut out: Vec<Method> = Vec::new();
    for a in arms().iter().filter(|a| installed(a.layout)) {
        if !out.contains(&a.method) {
            out.push(a.method);
        }
    }
    out
}

/// The warning for a set that serves no decode row (or no forward at all): the pack
/// converts, and the loader refuses it or a decode falls through.
pub fn unserved_warning(opts: &ConvertOptions) -> Option<String> {
    let set = opts.layouts.clone().unwrap_or_default();
    let served = served(&set);
    (!served.contains(&Method::Decode)).then(|| {
        let tags: Vec<&str> = set.iter().map(|l| l.tag()).collect();
        format!(
            "warning: layouts {} serve {}: an engine cannot decode from this pack (add nvfp4 or bf16)",
            tags.join(","),
            if served.is_empty() {
                "no forward".to_string()
            } else {
                format!(
                    "only {}",
                    served
                        .iter()
                        .map(|&m| method_name(m))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        )
    })
}

pub fn method_name(m: Method) -> &'static str {
    match m {
        Method::Decode => "decode",
        Method::Small => "2-3 rows",
        Method::Verify => "verify",
        Method::Prefill => "prefill",
        Method::Fixed => "fixed",
    }
}

/// `convert --dry-run`: the chosen layouts' cost, what they serve and the disk they need.
pub fn dry_run(
    model: &Model,
    opts: &ConvertOptions,
    out: &Path,
    refusal: Option<&str>,
) -> Result<()> {
    let mut w = std::io::stdout().lock();
    let fits = |set: &Option<Vec<Layout>>| {
        let ok = choices_for(model);
        set.iter()
            .flatten()
            .all(|l| *l == Layout::Lora || ok.contains(l))
    };
    let (costs, carried) = match (choice::dry_run(model, opts), refusal) {
        (Ok(t), _) => t,
        // A layout this model cannot take: the real run stops on the refusal before it would
        // meet that error (it measures only the layouts that fit), so this says the refusal.
        (Err(_), Some(why)) if !fits(&opts.layouts) => {
            writeln!(w, "convert would stop: {why} (--allow-requantize)")?;
            writeln!(w, "nothing written (--dry-run)")?;
            return Ok(());
        }
        (Err(e), _) => return Err(e.into()),
    };
    write_costs(&mut w, &costs, carried)?;
    if let Some(why) = refusal {
        writeln!(w, "convert would stop: {why} (--allow-requantize)")?;
    }
    let set: Vec<Layout> = costs.iter().map(|c| c.layout).collect();
    let served = served(&set);
    writeln!(
        w,
        "serves: {}",
        if served.is_empty() {
            "no forward (the loader refuses such a pack)".to_string()
        } else {
            served
                .iter()
                .map(|&m| method_name(m))
                .collect::<Vec<_>>()
                .join(", ")
        }
    )?;
    let total = carried + costs.iter().map(|c| c.bytes).sum::<u64>();
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match free_bytes(dir) {
        Some(free) => writeln!(
            w,
            "{}: {:.1} MB free for about {:.1} MB{}",
            dir.display(),
            free as f64 / 1e6,
            total as f64 / 1e6,
            if free < total { " (not enough)" } else { "" }
        )?,
        None => writeln!(w, "{}: free space unknown", dir.display())?,
    }
    writeln!(w, "nothing written (--dry-run)")?;
    if served.is_empty() {
        anyhow::bail!(
            "the layouts {} serve no forward; add nvfp4 or bf16",
            set.iter().map(|l| l.tag()).collect::<Vec<_>>().join(",")
        );
    }
    Ok(())
}

/// The cost table: a row per layout, then the carried bytes and the total.
fn write_costs(w: &mut impl Write, costs: &[LayoutCost], carried: u64) -> std::io::Result<()> {
    writeln!(
        w,
        "  {:<10} {:>10}  {:>9} {:>9} {:>9}  source",
        "layout", "MB", "gate", "up", "down"
    )?;
    for c in costs {
        let err = |p: &str| {
            c.rel_err
                .iter()
                .find(|(q, _)| q == p || (p != "down" && q == "gate_up"))
                .map_or("-".to_string(), |(_, e)| format!("{:.2}%", e * 100.0))
        };
        writeln!(
            w,
            "  {:<10} {:>10.1}  {:>9} {:>9} {:>9}  {}",
            c.layout.tag(),
            c.bytes as f64 / 1e6,
            err("gate"),
            err("up"),
            err("down"),
            match (c.requantizes, c.layout) {
                (true, _) => "re-quantized",
                (false, Layout::Bf16) => "values kept",
                (false, _) => "kept",
            }
        )?;
    }
    writeln!(
        w,
        "  other tensors, carried: {:.1} MB; these layouts and those: {:.1} MB",
        carried as f64 / 1e6,
        (carried + costs.iter().map(|c| c.bytes).sum::<u64>()) as f64 / 1e6
    )
}

/// One warning line per layout and projection whose worst error passes [`WARN_REL_ERR`].
pub fn far_warnings(fidelity: &[Fidelity]) -> Vec<String> {
    fidelity
        .iter()
        .filter(|f| f.worst_rel_err > WARN_REL_ERR)
        .map(|f| {
            format!(
                "warning: {} {} differs from the source's weights by {:.1}% (relative error, layer {}): \
                 a lossy layout; bf16 or a layout that keeps the source's format is closer",
                f.layout,
                f.proj,
                f.worst_rel_err * 100.0,
                f.worst_layer
            )
        })
        .collect()
}

/// Free bytes on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: FFI: `c` is a NUL-terminated path and `st` a writable statvfs the call fills;
    // it is read only when the call succeeds.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    st.f_bavail.checked_mul(st.f_frsize)
}
