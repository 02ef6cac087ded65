//! Fuzz harnesses: one function per target of `fuzz/` (cargo-fuzz, nightly) that CI also runs
//! on stable over the regression corpus in `fuzz/regressions/` (`tests/fuzz_regressions.rs`).
//!
//! Each harness feeds one input to a reader and asserts what the format promises, not only that
//! nothing panics: a GGUF or safetensors file that opens has every tensor's bytes inside the
//! file, and each decodes to its element count or fails with an error; a pack that opens decodes
//! every FFN blob to its manifest shape without error; a pack that loads on the host backend
//! installs every layer's overlays. A violated promise panics, which is how the fuzzer sees it.

use crate::gguf;
use crate::gpu::host::HostBackend;
use crate::gpu::{GpuBackend, upload_f32};
use crate::model::Model;
use crate::pack::{Pack, keys};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Run `f` on this thread as the only worker of a one-thread rayon pool, so the decoders'
/// parallel iterators run inline. Through the global pool, every decode call handed its work to
/// a pool thread and slept until it answered: a third of the `pack` target's time went to those
/// hand-offs (perf, 2026-12-02).
fn inline<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    thread_local! {
        static POOL: rayon::ThreadPool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .use_current_thread()
            .build()
            .expect("a one-thread pool on the current thread");
    }
    POOL.with(|p| p.install(f))
}

/// Write `data` to a per-process scratch file named `*.EXT` (tmpfs when there is one) and call
/// `f` with its path. The file readers take paths, so the harnesses give them one.
fn with_file(data: &[u8], ext: &str, f: impl FnOnce(&Path) + Send) {
    let dir = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    // Unique per call: the CI replay runs harnesses on parallel threads of one process, and a
    // file rewritten under another thread's map would end that thread in SIGBUS.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = dir.join(format!("metrale-fuzz-{}-{n}.{ext}", std::process::id()));
    std::fs::write(&p, data).expect("scratch file");
    inline(|| f(&p));
    let _ = std::fs::remove_file(&p);
}

/// If `img` parses as a GGUF with a pack header checksum, rewrite the checksum so that the
/// fuzzer's edits (and the tests' hostile edits) reach the manifest checks instead of stopping
/// at the checksum. Returns whether it rewrote one.
pub fn rehash(img: &mut [u8]) -> bool {
    let Ok(p) = gguf::parse(img, "fuzz") else {
        return false;
    };
    let Some(kv) = p.kvs.iter().find(|kv| kv.key == keys::HEADER_XXH3) else {
        return false;
    };
    let (Some(at), Ok(end)) = (kv.span.end.checked_sub(8), usize::try_from(p.data_offset)) else {
        return false;
    };
    if end > img.len() || at + 8 > end {
        return false;
    }
    let d = crate::pack_check::header_digest(&img[..end], at);
    img[at..at + 8].copy_from_slice(&d.to_le_bytes());
    true
}

/// Every tensor of an opened model: its bytes lie inside its file, and it decodes to its
/// element count or fails with an error.
fn check_model(m: &Model) {
    for (i, t) in m.tensors.iter().enumerate() {
        // Every shape's element count fits int64 however its dimensions are multiplied.
        let nonzero = t.shape.iter().filter(|&&d| d != 0);
        assert!(
            nonzero
                .clone()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .is_some_and(|p| p <= i64::MAX as u64),
            "{}: shape {:?} overflows",
            t.name,
            t.shape
        );
        let len = m.files[t.file].bytes().len() as u64;
        let end = t.offset.checked_add(t.bytes);
        assert!(
            end.is_some_and(|e| e <= len),
            "{}: bytes {}+{} outside a file of {len}",
            t.name,
            t.offset,
            t.bytes
        );
        if let Ok(v) = m.decode_tensor(i) {
            assert_eq!(v.len() as u64, t.elems(), "{}: decoded length", t.name);
        }
    }
    for l in &m.ffn_layers {
        for w in [&l.gate, &l.up, &l.down] {
            if let Ok((v, s)) = m.decode_weight(w) {
                assert_eq!(
                    v.len() as u64,
                    s.iter().product::<u64>(),
                    "decoded weight length"
                );
            }
        }
    }
}

/// Target `gguf`: the GGUF reader on any bytes, then the model built on it.
pub fn gguf_bytes(data: &[u8]) {
    let Ok(p) = gguf::parse(data, "fuzz") else {
        return;
    };
    for t in &p.tensors {
        let end = t.file_offset.checked_add(t.bytes);
        assert!(
            end.is_some_and(|e| e <= data.len() as u64),
            "{}: outside the buffer",
            t.name
        );
    }
    with_file(data, "gguf", |path| {
        if let Ok(m) = Model::open(path) {
            check_model(&m);
        }
    });
}

/// Target `safetensors`: the safetensors reader and the model built on it (including the
/// quantized schemes it recognizes).
pub fn safetensors_bytes(data: &[u8]) {
    with_file(data, "safetensors", |path| {
        if let Ok(m) = Model::open(path) {
            check_model(&m);
        }
    });
}

/// What an opened pack promises: every tensor inside the file, every FFN blob decodes to its
/// manifest shape, the checksums and padding can be read, and `dump` of any tensor works or
/// fails with an error.
fn check_pack(path: &Path, pack: &Pack) {
    let len = pack.file.map.len() as u64;
    for t in &pack.file.tensors {
        assert!(t.file_offset.checked_add(t.bytes).is_some_and(|e| e <= len));
    }
    for e in &pack.manifest.tensors {
        let Some(fe) = &e.ffn else { continue };
        match pack.decode_ffn(&e.name) {
            Ok((v, shape)) => {
                assert_eq!(shape, fe.shape, "{}: decoded shape", e.name);
                assert_eq!(v.len() as u64, shape[0] * shape[1], "{}: length", e.name);
            }
            Err(err) => panic!(
                "{} opened but {} does not decode: {err}",
                path.display(),
                e.name
            ),
        }
    }
    pack.verify_checksums().expect("pread of an opened pack");
    crate::pack_check::nonzero_padding(&pack.file).expect("pread of an opened pack");
    if let Ok(m) = Model::open(path) {
        check_model(&m);
    }
}

/// Target `pack`: `Pack::open` on any bytes (the header checksum rewritten to match), then
/// every decoder and `dump`'s paths.
pub fn pack_bytes(data: &[u8]) {
    let mut img = data.to_vec();
    rehash(&mut img);
    with_file(&img, "mpk.gguf", |path| {
        if let Ok(pack) = Pack::open(path) {
            check_pack(path, &pack);
        }
    });
}

/// `template` (a pack) with its manifest replaced by `json` and the header checksum rewritten;
/// `None` when the template does not parse.
pub fn with_manifest(template: &[u8], json: &str) -> Option<Vec<u8>> {
    let p = gguf::parse(template, "template").ok()?;
    let kv = p.kvs.iter().find(|kv| kv.key == keys::MANIFEST)?;
    // The header's end: the KVs, then the tensor infos (name, dims, type, offset each).
    let kvs_end = p.kvs.last()?.span.end;
    let infos: usize = p
        .tensors
        .iter()
        .map(|t| 8 + t.name.len() + 4 + 8 * t.ne.len() + 4 + 8)
        .sum();
    let rest = template.get(kv.span.end..kvs_end.checked_add(infos)?)?;
    // Trailing spaces in the JSON put the header's end (so the data section) on a page.
    let page = crate::pack::PACK_PAGE as usize;
    let fixed = kv.span.start + 8 + kv.key.len() + 4 + 8 + json.len() + rest.len();
    let spaces = (page - fixed % page) % page;
    let padded = format!("{json}{}", " ".repeat(spaces));
    let mut img = template[..kv.span.start].to_vec();
    img.extend_from_slice(&(kv.key.len() as u64).to_le_bytes());
    img.extend_from_slice(kv.key.as_bytes());
    img.extend_from_slice(&(gguf::ValueType::String as u32).to_le_bytes());
    crate::gguf_write::encode_value(&gguf::Value::String(padded), &mut img);
    img.extend_from_slice(rest);
    img.extend_from_slice(template.get(p.data_offset as usize..)?);
    rehash(&mut img);
    Some(img)
}

/// Target `manifest`: any manifest JSON in a real pack, through `Pack::open`'s checks, then
/// every decoder.
pub fn manifest_json(template: &[u8], json: &[u8]) {
    let Ok(s) = std::str::from_utf8(json) else {
        return;
    };
    let Some(img) = with_manifest(template, s) else {
        return;
    };
    with_file(&img, "mpk.gguf", |path| {
        if let Ok(pack) = Pack::open(path) {
            check_pack(path, &pack);
        }
    });
}

/// Target `loader`: the fast-start loader on the host backend over any bytes (the header
/// checksum rewritten): a pack that loads installs every layer's overlays into a layer of the
/// manifest's shape, and one row runs through it or fails with an error.
pub fn loader_bytes(data: &[u8]) {
    use crate::ffn::{DenseFfnLayer, FfnConfig, ForwardContext};
    let mut img = data.to_vec();
    rehash(&mut img);
    with_file(&img, "mpk.gguf", |path| {
        let b: Arc<dyn GpuBackend> = Arc::new(HostBackend::new());
        let Ok(lp) = crate::loader::load(b.as_ref(), path, &Default::default()) else {
            return;
        };
        let m = &lp.pack.manifest.model;
        let cfg = FfnConfig {
            hidden: m.hidden_size as usize,
            inter: m.intermediate_size as usize,
        };
        let mut ctx = ForwardContext::new(b.clone(), cfg, 1, Default::default())
            .expect("host arena for a loaded pack");
        let x = b.alloc(cfg.hidden as u64 * 4).expect("host input");
        upload_f32(b.as_ref(), x, &vec![0.5; cfg.hidden]).expect("host upload");
        for ov in &lp.layers {
            let mut l = DenseFfnLayer::new(&ctx);
            ov.install(&mut l)
                .unwrap_or_else(|e| panic!("layer {} loaded but does not install: {e}", ov.index));
            let _ = l.forward(&mut ctx, x);
        }
    });
}

/// Target `npy`: `ffn-apply`'s `.npy` reader on any bytes: what parses holds exactly the bytes
/// its shape and dtype need, and its shape's element count fits.
pub fn npy_bytes(data: &[u8]) {
    let Ok(n) = crate::npy::parse(data) else {
        return;
    };
    let elems = n
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .expect("a parsed shape's element count fits");
    let size = match n.dtype {
        crate::npy::NpyDtype::F32 => 4,
        crate::npy::NpyDtype::U8 => 1,
    };
    assert_eq!(Some(n.data.len()), elems.checked_mul(size), "data length");
}

/// Target `convert`: `convert` on a GGUF source mutant: the pack it writes opens and is
/// re-derived from the source bit for bit, or the convert fails and leaves no file.
pub fn convert_bytes(data: &[u8]) {
    use crate::converters::layouts::Layout;
    use crate::pack::{self, ConvertOptions};
    with_file(data, "gguf", |path| {
        let Ok(m) = Model::open(path) else {
            return;
        };
        let out = path.with_extension("mpk.gguf");
        let opts = ConvertOptions {
            layouts: Some(vec![Layout::Nvfp4, Layout::Bf16]),
            ..Default::default()
        };
        match pack::convert(&m, &opts, &out, &|_, _| {}) {
            Ok(_) => {
                let p = Pack::open(&out).expect("a converted pack opens");
                let bad = p.verify_checksums().expect("pread of a converted pack");
                assert!(bad.is_empty(), "checksums: {bad:?}");
                let c = pack::verify_against_source(&p, &m).expect("verify --source");
                assert!(c.mismatched.is_empty(), "re-derived: {:?}", c.mismatched);
                let _ = std::fs::remove_file(&out);
            }
            Err(_) => assert!(!out.exists(), "a failed convert left {}", out.display()),
        }
    });
}
