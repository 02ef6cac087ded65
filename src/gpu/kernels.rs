//! The CUDA kernel sources, compiled into the binary so a deployed engine needs no source tree.
//! A layout's own modules are in its folder (`src/layouts/TAG/kernels*.cu`), the shared ones
//! (activations, q8_1, probes, blob rules, the headers) in `kernels/`; the host backend
//! implements the same names.

/// Generates [`MODULES`] from the list of built-in layouts (`layouts::builtin_layouts!`): the
/// shared modules, then each layout's (`src/layouts/TAG/kernels.rs`) in `Layout` order.
macro_rules! modules {
    (layouts: [$($t:ident $v:ident $d:literal),*], install: [$($i:ident),*]) => {
        /// (module, source) of every kernel module: the shared ones in `kernels/`, then each
        /// built-in layout's.
        pub static MODULES: LazyLock<Vec<(&'static str, &'static str)>> = LazyLock::new(|| {
            let mut v = vec![
                ("ffn_act", include_str!("../../kernels/ffn_act.cu")),
                ("ffn_q8_1", include_str!("../../kernels/ffn_q8_1.cu")),
                ("probe", include_str!("../../kernels/probe.cu")),
                ("rules", include_str!("../../kernels/rules.cu")),
            ];
            $(v.extend_from_slice(&crate::layouts::$t::kernels::MODULES[..]);)*
            v
        });
    };
}
crate::layouts::builtin_layouts!(modules);
use std::sync::LazyLock;

/// Modules written for one architecture's own instructions (`wgmma`, `setmaxnreg`): the
/// device arch they run on and the target NVRTC compiles them for.
pub const ARCH_SPECIFIC: &[(&str, &str, &str)] = &[("ffn_w8a8_wgmma", "sm_90", "sm_90a")];

/// The target NVRTC compiles `module` for on a device of `device_arch` (`sm_90`): the device's
/// own for portable modules, the arch-specific target (`sm_90a`) for a module written for it,
/// and `None` where the module cannot run on this device (its arms fall back).
pub fn module_arch(module: &str, device_arch: &str) -> Option<String> {
    match ARCH_SPECIFIC.iter().find(|(m, _, _)| *m == module) {
        Some((_, dev, target)) => (*dev == device_arch).then(|| target.to_string()),
        None => Some(device_arch.to_string()),
    }
}

/// The helpers every module may share (`kernels/common.cuh`).
pub const COMMON: &str = include_str!("../../kernels/common.cuh");

/// The line by which a module includes [`COMMON`].
const INCLUDE_COMMON: &str = "#include \"common.cuh\"";

/// Hopper's inline PTX for the sm_90a modules (`kernels/wgmma.cuh`).
pub const WGMMA: &str = include_str!("../../kernels/wgmma.cuh");

/// The line by which a module includes [`WGMMA`].
const INCLUDE_WGMMA: &str = "#include \"wgmma.cuh\"";

/// The source of a module as NVRTC compiles it: the shared sizes' `#define`s
/// (`sizes::cuda_defines`), then the module with its `#include "common.cuh"` and
/// `#include "wgmma.cuh"` replaced by those headers' text.
pub fn source(module: &str) -> Option<String> {
    MODULES.iter().find(|(m, _)| *m == module).map(|(_, s)| {
        let s = s.replacen(INCLUDE_COMMON, COMMON, 1);
        super::sizes::cuda_defines() + &s.replacen(INCLUDE_WGMMA, WGMMA, 1)
    })
}

/// `src` without its `//` comments and macro continuation backslashes, its lines joined by
/// `sep`.
fn logical_text(src: &str, sep: &str) -> String {
    src.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .map(|l| l.trim_end().trim_end_matches('\\'))
        .collect::<Vec<_>>()
        .join(sep)
}

/// The text that opens every kernel definition.
const DEFINITION: &str = "extern \"C\" __global__ void ";

/// `(name, parameter list, text after the list)` of the definition that `s` starts with (the
/// text after [`DEFINITION`]), skipping a `__launch_bounds__(..)`; the list ends at the first `)`
/// or, on a line that continues, at the end of `s`.
fn definition(s: &str) -> Option<(&str, &str, &str)> {
    let mut r = s.trim_start();
    if let Some(after) = r.strip_prefix("__launch_bounds__(") {
        r = after.split_once(')')?.1.trim_start();
    }
    let (name, tail) = r.split_once('(')?;
    let (params, rest) = tail.split_once(')').unwrap_or((tail, ""));
    Some((name.trim(), params, rest))
}

/// The `extern "C" __global__` entry points a module defines (parsed from its source): direct
/// definitions (with or without `__launch_bounds__(..)`), and instantiations `MACRO(name, ..)`
/// of a `#define MACRO(NAME, ..)` whose body defines an `extern "C"` kernel.
pub fn entry_points(module: &str) -> Vec<String> {
    let Some(src) = source(module) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut macros: Vec<String> = Vec::new();
    let mut in_define: Option<String> = None;
    for line in src.lines() {
        let l = line.trim_start();
        if let Some(m) = in_define.take() {
            if l.contains("extern \"C\"") {
                macros.push(m);
            } else if line.trim_end().ends_with('\\') {
                in_define = Some(m);
            }
            continue;
        }
        if let Some(rest) = l.strip_prefix("#define ") {
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            if rest.contains("extern \"C\"") {
                macros.push(name);
            } else if line.trim_end().ends_with('\\') {
                in_define = Some(name);
            }
            continue;
        }
        if let Some(rest) = l.strip_prefix(DEFINITION) {
            if let Some((name, _, _)) = definition(rest) {
                out.push(name.to_string());
            }
            continue;
        }
        for m in &macros {
            if let Some(args) = l.strip_prefix(m.as_str()).and_then(|r| r.strip_prefix('('))
                && let Some(name) = args.split([',', ')']).next()
            {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

/// The kind of one kernel parameter, as a launch must pass it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// Any pointer (`KArg::Ptr`).
    Ptr,
    /// `int` (`KArg::I32` or `KArg::Dim`).
    Int,
    /// `float` (`KArg::F32`).
    Float,
    /// A tensor map by value (`const __grid_constant__ MpTmap`; `KArg::Tmap`).
    Tmap,
}

/// Every entry point's parameters (name and kind), parsed from the `extern "C" __global__`
/// signatures of its module (direct definitions and the kernels that a `#define` instantiates).
pub fn signatures(module: &str) -> Vec<(String, Vec<(String, ParamKind)>)> {
    let Some(src) = source(module) else {
        return Vec::new();
    };
    // One logical text: macro continuations joined, comments dropped.
    let text = logical_text(&src, " ");
    let kinds = |params: &str| -> Vec<(String, ParamKind)> {
        params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                let kind = if p.contains("MpTmap") {
                    ParamKind::Tmap
                } else if p.contains('*') {
                    ParamKind::Ptr
                } else if p.starts_with("float ") || p.starts_with("const float ") {
                    ParamKind::Float
                } else {
                    ParamKind::Int
                };
                // The name is the declaration's last word (after `*` and `__restrict__`).
                let name = p
                    .rsplit(|c: char| c.is_whitespace() || c == '*')
                    .next()
                    .unwrap_or("");
                (name.to_string(), kind)
            })
            .collect()
    };
    // `extern "C" __global__ void [__launch_bounds__(..)] NAME(params)`: (name, params).
    let mut defs: Vec<(&str, &str)> = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find(DEFINITION) {
        let Some((name, params, tail)) = definition(&rest[i + DEFINITION.len()..]) else {
            break;
        };
        defs.push((name, params));
        rest = tail;
    }
    let mut out = Vec::new();
    let entries = entry_points(module);
    for e in &entries {
        if let Some((_, p)) = defs.iter().find(|(n, _)| n == e) {
            out.push((e.clone(), kinds(p)));
        }
    }
    // Macro instances: each `#define MACRO(NAME, ..)` body (its continuation lines) holds one
    // `extern "C"` definition named `NAME`; an instance `MACRO(name, ..)` has its parameters.
    let lines: Vec<&str> = src.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        let Some(rest) = l.strip_prefix("#define ") else {
            i += 1;
            continue;
        };
        let mut body = String::from(rest.trim_end().trim_end_matches('\\'));
        while lines[i].trim_end().ends_with('\\') && i + 1 < lines.len() {
            i += 1;
            body.push(' ');
            body.push_str(lines[i].trim_end().trim_end_matches('\\'));
        }
        i += 1;
        let Some((mac, margs)) = body.split_once('(') else {
            continue;
        };
        let placeholder = margs
            .split([',', ')'])
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        let Some((name, params, _)) = body
            .find(DEFINITION)
            .and_then(|d| definition(&body[d + DEFINITION.len()..]))
        else {
            continue;
        };
        if name != placeholder {
            continue;
        }
        let mac = mac.trim();
        for e in &entries {
            let used = src.contains(&format!("{mac}({e},")) || src.contains(&format!("{mac}({e})"));
            if used && !out.iter().any(|(n, _)| n == e) {
                out.push((e.clone(), kinds(params)));
            }
        }
    }
    out
}

/// Whether entry point `entry` of `module` calls `pdl_wait()` (kernels/common.cuh), directly or
/// through the functions and `#define`d kernels of its source that it names: a text search over
/// the bodies, each found by its head at brace depth 0 (strings skipped), keyed by the name
/// before the head's last parenthesised list and, for a `#define`, by the macro's name.
#[cfg(test)]
pub(crate) fn calls_pdl_wait(module: &str, entry: &str) -> bool {
    let Some(src) = source(module) else {
        return false;
    };
    let text = logical_text(&src, "\n");
    let bodies = function_bodies(&text);
    let named = |body: &str, name: &str| {
        body.match_indices(name).any(|(i, _)| {
            let before = body[..i].chars().next_back();
            let after = body[i + name.len()..].trim_start().chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && matches!(after, Some('(' | '<'))
        })
    };
    // The entry's own body, else the body of the macro that instantiates it (`MACRO(entry, ..)`).
    let start = bodies.iter().position(|(n, _)| n == entry).or_else(|| {
        bodies.iter().position(|(n, _)| {
            text.contains(&format!("{n}({entry},")) || text.contains(&format!("{n}({entry})"))
        })
    });
    let mut seen = vec![false; bodies.len()];
    let mut todo: Vec<usize> = start.into_iter().collect();
    while let Some(i) = todo.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        let body = &bodies[i].1;
        if named(body, "pdl_wait") {
            return true;
        }
        todo.extend((0..bodies.len()).filter(|&j| !seen[j] && named(body, &bodies[j].0)));
    }
    false
}

/// `(name, body)` of every brace block at depth 0 of `text` whose head (the text since the
/// previous block or `;` at depth 0) holds a parenthesised list; a `#define` head also keys the
/// body by the macro's name.
#[cfg(test)]
fn function_bodies(text: &str) -> Vec<(String, String)> {
    let ident_before = |s: &str| -> String {
        s.trim_end()
            .chars()
            .rev()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect()
    };
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    let (mut head_start, mut body_start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        if in_str {
            (in_str, esc) = match (esc, c) {
                (true, _) => (true, false),
                (false, '\\') => (true, true),
                (false, '"') => (false, false),
                _ => (true, false),
            };
            continue;
        }
        match c {
            '"' => in_str = true,
            '{' => {
                if depth == 0 {
                    body_start = i;
                }
                depth += 1;
            }
            '}' if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    let head = &text[head_start..body_start];
                    let body = text[body_start..=i].to_string();
                    if let Some(p) = head.rfind('(') {
                        // The name before the last list (after `__launch_bounds__(..)` too).
                        out.push((ident_before(&head[..p]), body.clone()));
                    }
                    if let Some(d) = head.rfind("#define ") {
                        let m = &head[d + 8..];
                        let name = m.split(['(', ' ']).next().unwrap_or("").to_string();
                        out.push((name, body));
                    }
                    head_start = i + 1;
                }
            }
            ';' if depth == 0 => head_start = i + 1,
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_common_header_is_inlined_and_defines_no_kernel() {
        assert!(!super::COMMON.contains("extern \"C\""));
        assert!(!super::WGMMA.contains("extern \"C\""));
        for (m, raw) in super::MODULES.iter() {
            let s = super::source(m).unwrap();
            assert!(!s.contains(super::INCLUDE_COMMON), "{m}");
            assert!(!s.contains(super::INCLUDE_WGMMA), "{m}");
            assert_eq!(
                raw.contains(super::INCLUDE_WGMMA),
                s.contains("wgmma.mma_async"),
                "{m}"
            );
            assert_eq!(
                raw.contains(super::INCLUDE_COMMON),
                s.contains("block_amax"),
                "{m}"
            );
        }
    }

    #[test]
    fn every_entry_point_has_a_parsed_signature() {
        use super::ParamKind::{Float, Int, Ptr, Tmap};
        for (m, _) in super::MODULES.iter() {
            let sigs = super::signatures(m);
            for e in super::entry_points(m) {
                let s = sigs.iter().find(|(n, _)| *n == e);
                assert!(s.is_some_and(|(_, k)| !k.is_empty()), "{m}::{e}: {s:?}");
            }
        }
        let find = |m: &str, n: &str| -> Vec<super::ParamKind> {
            super::signatures(m)
                .into_iter()
                .find(|(e, _)| e == n)
                .unwrap()
                .1
                .into_iter()
                .map(|(_, k)| k)
                .collect()
        };
        assert_eq!(
            find("ffn_act", "act_mul_silu"),
            [Ptr, Ptr, Ptr, Int, Int, Int, Int, Int]
        );
        // A macro instance takes its own macro's parameters, not another macro's.
        assert_eq!(find("ffn_nvfp4", "w4a16_gemm_t").len(), 11);
        assert_eq!(
            find("ffn_nvfp4", "w4a16_gemv_batch2"),
            [Ptr, Int, Ptr, Ptr, Float, Ptr, Int, Int, Int, Int]
        );
        // Tensor maps by value (`const __grid_constant__ MpTmap q`).
        assert_eq!(
            find("ffn_w8a8_wgmma", "w8a8_wgmma"),
            [Tmap, Ptr, Int, Tmap, Ptr, Ptr, Int, Int, Int]
        );
    }

    #[test]
    fn entry_points_include_launch_bounds_and_macro_instances() {
        let e = super::entry_points("ffn_nvfp4");
        for want in [
            "w4a16_gemv",
            "w4a16_gemv_batch2",
            "w4a16_gemv_dual_batch3",
            "nvfp4_proj_small_m16",
            "w4a16_gemm_t_m128_v2",
            "nvfp4_mmq_gemm",
            "nvfp4_proj_mx",
        ] {
            assert!(e.iter().any(|n| n == want), "{want} not in {e:?}");
        }
        assert!(
            !e.iter()
                .any(|n| n.contains("NAME") || n.contains("__launch")),
            "{e:?}"
        );
    }
}
