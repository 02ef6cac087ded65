//! Kernels compiled ahead of time: the cubins NVRTC 13.0.88 makes of every module for sm_90
//! (sm_90a for the modules written for Hopper's own instructions), embedded in the binary, so a
//! fresh machine's first load compiles nothing and needs no libnvrtc. Each is used only while
//! the module's source is the one it was built from (`kernels/prebuilt/index.txt` holds the
//! source's xxh3-64); any other module, source or target goes to NVRTC as before, with one log
//! line. `tests/kernels_compile.rs` holds every committed cubin bit for bit against NVRTC's
//! output for the current sources (`METRALE_BLESS=1` rewrites them after a kernel change).

/// The device architecture the prebuilt cubins are for.
pub const PREBUILT_DEVICE: &str = "sm_90";

/// An embedded image, aligned as the heap buffers NVRTC returns are (the driver reads the ELF
/// image in place).
#[repr(C, align(64))]
struct Aligned<B: ?Sized>(B);

macro_rules! embed {
    ($path:literal) => {{
        const IMAGE: &Aligned<[u8]> = &Aligned(*include_bytes!($path));
        &IMAGE.0
    }};
}

/// (module, target, cubin) of every prebuilt module.
pub const PREBUILT: &[(&str, &str, &[u8])] = &[
    (
        "ffn_act",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_act-sm_90.cubin"),
    ),
    (
        "ffn_fp8",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_fp8-sm_90.cubin"),
    ),
    (
        "ffn_w8a8",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_w8a8-sm_90.cubin"),
    ),
    (
        "ffn_bf16",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_bf16-sm_90.cubin"),
    ),
    (
        "ffn_nvfp4",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_nvfp4-sm_90.cubin"),
    ),
    (
        "ffn_lora",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_lora-sm_90.cubin"),
    ),
    (
        "ffn_q8_1",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_q8_1-sm_90.cubin"),
    ),
    (
        "ffn_q2g128",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_q2g128-sm_90.cubin"),
    ),
    (
        "ffn_affine",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_affine-sm_90.cubin"),
    ),
    (
        "ffn_q4k_mmq",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_q4k_mmq-sm_90.cubin"),
    ),
    (
        "ffn_ggml",
        "sm_90",
        embed!("../../kernels/prebuilt/ffn_ggml-sm_90.cubin"),
    ),
    (
        "ffn_w8a8_wgmma",
        "sm_90a",
        embed!("../../kernels/prebuilt/ffn_w8a8_wgmma-sm_90a.cubin"),
    ),
    (
        "probe",
        "sm_90",
        embed!("../../kernels/prebuilt/probe-sm_90.cubin"),
    ),
    (
        "rules",
        "sm_90",
        embed!("../../kernels/prebuilt/rules-sm_90.cubin"),
    ),
];

/// `module target xxh3-64-of-the-source` per line: what each cubin was built from.
pub const INDEX: &str = include_str!("../../kernels/prebuilt/index.txt");

/// The hash the index records for `module`'s current source built for `target`.
pub fn source_key(module: &str, target: &str) -> Option<u64> {
    let src = super::kernels::source(module)?;
    Some(xxhash_rust::xxh3::xxh3_64(
        format!("{src}\0{target}").as_bytes(),
    ))
}

/// The index's hash for `(module, target)`, if it lists one.
fn indexed(module: &str, target: &str) -> Option<u64> {
    INDEX.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some(module) && f.next() == Some(target))
            .then(|| f.next().and_then(|h| u64::from_str_radix(h, 16).ok()))
            .flatten()
    })
}

/// Why a module has no usable prebuilt cubin for `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// None is built for this target (another device architecture).
    Target,
    /// One is built, but from another source than this binary's (a kernel edited since).
    Stale,
}

/// The prebuilt cubin of `module` for `target`, when it was built from this binary's source.
pub fn cubin(module: &str, target: &str) -> Result<&'static [u8], Missing> {
    let (_, _, bytes) = PREBUILT
        .iter()
        .find(|(m, t, _)| *m == module && *t == target)
        .ok_or(Missing::Target)?;
    match (indexed(module, target), source_key(module, target)) {
        (Some(a), Some(b)) if a == b => Ok(bytes),
        _ => Err(Missing::Stale),
    }
}
