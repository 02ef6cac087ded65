//! `libmetrale_pack_c`: the C ABI of the crate's convert (`mp_convert`, its options the
//! library's table) and loader (`include/metrale_pack.h` is its contract). Each entry point catches panics (none may unwind into C), records why it failed
//! in a thread-local string (`mp_last_error`, cleared by every call that succeeds), and touches
//! a model only through a pointer `mp_load` returned that is still live: every handle is in a
//! registry from `mp_load` to `mp_free`, so a freed, foreign or twice-freed pointer is an error,
//! never a read of freed memory or a double free.

use metrale_pack::gpu::host::HostBackend;
use metrale_pack::gpu::{Device, DevicePtr};
use metrale_pack::loader::{EngineOptions, LoadedModel};
use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::{CStr, CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};

/// The addresses of the live models (`mp_load` adds, `mp_free` removes).
static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Whether `p` is a live model's address; with `remove`, it is no longer (for `mp_free`).
fn live(p: *const Model, remove: bool) -> bool {
    let mut g = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    let set = g.get_or_insert_with(HashSet::new);
    if remove {
        set.remove(&(p as usize))
    } else {
        set.contains(&(p as usize))
    }
}

/// DLPack's device types, as the header's `MP_DEVICE_*`.
const DEVICE_CPU: i32 = 1;
const DEVICE_CUDA: i32 = 2;
/// The header's `MP_MAX_DIMS`.
const MAX_DIMS: usize = 8;
/// The header's `MP_MAX_ROWS`: the library's limit, checked when this library builds.
const MAX_ROWS: usize = 65536;
const _: () = assert!(MAX_ROWS == metrale_pack::ffn::MAX_FORWARD_ROWS);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: impl std::fmt::Display) {
    let s = CString::new(msg.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = s);
}

/// Run `f`, turning an error or a panic into `fail` with the reason recorded; a success clears
/// the reason.
fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, String>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => {
            set_error("");
            v
        }
        Ok(Err(e)) => {
            set_error(e);
            fail
        }
        Err(_) => {
            set_error("internal error (a panic in metrale-pack)");
            fail
        }
    }
}

/// A device tensor as `mp_tensor` reports it, its strings owned here.
struct Tensor {
    name: CString,
    ty: CString,
    source_type: CString,
    ffn_json: Option<CString>,
    data: u64,
    bytes: u64,
    shape: Vec<u64>,
}

/// What `mp_load` returns.
pub struct Model {
    m: LoadedModel,
    device: (i32, i32),
    tensors: Vec<Tensor>,
}

/// The header's `mp_tensor`.
#[repr(C)]
pub struct MpTensor {
    name: *const c_char,
    ty: *const c_char,
    source_type: *const c_char,
    ffn_json: *const c_char,
    data: u64,
    bytes: u64,
    ndim: i32,
    shape: [u64; MAX_DIMS],
}

fn cstr(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

/// A C string argument, or why not.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
unsafe fn arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, String> {
    if p.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: per this function's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| format!("{what} is not UTF-8"))
}

fn load(path: &str, device: &str, verify: bool, max_rows: usize) -> Result<Model, String> {
    let device = Device::parse(device)?;
    let (backend, dl) = (
        device.backend().map_err(|e| e.to_string())?,
        device.dlpack(),
    );
    let opts = EngineOptions {
        verify_checksums: verify,
        max_tokens: max_rows.max(1),
        ..EngineOptions::default()
    };
    let m =
        LoadedModel::load(std::path::Path::new(path), backend, &opts).map_err(|e| e.to_string())?;
    let mut tensors = Vec::new();
    for t in m.pack.device_tensors() {
        let data = if dl.0 == DEVICE_CPU {
            HostBackend::shared()
                .host_address(t.ptr)
                .map_err(|e| e.to_string())? as u64
        } else {
            t.ptr.addr
        };
        let ffn_json = match &t.entry.ffn {
            Some(f) => Some(cstr(&serde_json::to_string(f).map_err(|e| e.to_string())?)),
            None => None,
        };
        if t.shape.len() > MAX_DIMS {
            return Err(format!(
                "{}: {} dimensions, at most {MAX_DIMS}",
                t.name,
                t.shape.len()
            ));
        }
        tensors.push(Tensor {
            name: cstr(t.name),
            ty: cstr(&format!("{:?}", t.ty)),
            source_type: cstr(t.source_type),
            ffn_json,
            data,
            bytes: t.ptr.bytes,
            shape: t.shape.clone(),
        });
    }
    Ok(Model {
        m,
        device: dl,
        tensors,
    })
}

/// The convert options as C strings, built once: (name, kind, help) per row of
/// `options::CONVERT`.
static OPTIONS: std::sync::LazyLock<Vec<[CString; 3]>> = std::sync::LazyLock::new(|| {
    metrale_pack::options::CONVERT
        .iter()
        .map(|o| [cstr(o.name), cstr(&o.kind.describe()), cstr(o.help)])
        .collect()
});

/// # Safety
/// Per the header: `kind` and `help` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_convert_option(
    index: usize,
    kind: *mut *const c_char,
    help: *mut *const c_char,
) -> *const c_char {
    guard(std::ptr::null(), || {
        let Some([n, k, h]) = OPTIONS.get(index) else {
            return Ok(std::ptr::null());
        };
        for (out, s) in [(kind, k), (help, h)] {
            if !out.is_null() {
                // SAFETY: a non-NULL pointer the caller gives writable (the header's contract).
                unsafe { *out = s.as_ptr() };
            }
        }
        Ok(n.as_ptr())
    })
}

/// # Safety
/// Per the header: NUL-terminated strings (NULL refused); `names` and `values` hold `count`
/// such strings each (NULL with `count` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_convert(
    src: *const c_char,
    out: *const c_char,
    names: *const *const c_char,
    values: *const *const c_char,
    count: usize,
) -> i32 {
    guard(-1, || {
        // SAFETY: the caller passes NUL-terminated strings (or NULL, refused).
        let (src, out) = unsafe { (arg(src, "src")?, arg(out, "out")?) };
        if count > 0 && (names.is_null() || values.is_null()) {
            return Err(format!("{count} options, and names or values is NULL"));
        }
        let mut req = metrale_pack::ConvertRequest::default();
        for i in 0..count {
            // SAFETY: `names` and `values` hold `count` pointers each (the header's contract),
            // each a NUL-terminated string or NULL (refused by `arg`).
            let (name, value) = unsafe {
                (
                    arg(*names.add(i), "an option's name")?,
                    arg(*values.add(i), "an option's value")?,
                )
            };
            req.set(name, value).map_err(|e| e.to_string())?;
        }
        let model = metrale_pack::Model::open(src).map_err(|e| e.to_string())?;
        req.convert(
            model,
            out,
            &|_, _| {},
            &std::sync::atomic::AtomicBool::new(false),
        )
        .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// # Safety
/// Per the header: NUL-terminated strings or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_load(
    path: *const c_char,
    device: *const c_char,
    verify_checksums: i32,
    max_rows: usize,
) -> *mut Model {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the caller passes NUL-terminated strings (or NULL, refused).
        let (path, device) = unsafe { (arg(path, "path")?, arg(device, "device")?) };
        let m = load(path, device, verify_checksums != 0, max_rows)?;
        let p = Box::into_raw(Box::new(m));
        LIVE.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(HashSet::new)
            .insert(p as usize);
        Ok(p)
    })
}

/// # Safety
/// `model` is NULL or any pointer: only a live model from `mp_load` is freed (a pointer freed
/// before, or not from `mp_load`, is an error); not in use by another thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_free(model: *mut Model) -> i32 {
    guard(-1, || {
        if model.is_null() {
            return Ok(0);
        }
        if !live(model, true) {
            return Err(format!(
                "mp_free: {model:p} is not a live model (freed before, or not from mp_load)"
            ));
        }
        // SAFETY: a live model from `mp_load` (in the registry until just now), taken out of
        // the registry once, so freed once.
        drop(unsafe { Box::from_raw(model) });
        Ok(0)
    })
}

/// Why `model` is no model to use: NULL, or not live.
fn not_live(model: *const Model) -> String {
    if model.is_null() {
        "model is NULL".to_string()
    } else {
        format!("model {model:p} is not a live model (freed, or not from mp_load)")
    }
}

/// The model behind a pointer, or why not.
///
/// # Safety
/// `model` is NULL, a live model from `mp_load`, or a pointer the registry does not hold.
unsafe fn model_ref<'a>(model: *const Model) -> Result<&'a Model, String> {
    if model.is_null() || !live(model, false) {
        return Err(not_live(model));
    }
    // SAFETY: a live model (checked in the registry above).
    Ok(unsafe { &*model })
}

/// Why the last call on this thread failed ("" after a success); the string lives until the
/// thread's next call.
#[unsafe(no_mangle)]
pub extern "C" fn mp_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// # Safety
/// `model` is NULL or a live model from `mp_load`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_device_type(model: *const Model) -> i32 {
    // SAFETY: per this function's contract.
    guard(-1, || Ok(unsafe { model_ref(model) }?.device.0))
}

/// # Safety
/// `model` is NULL or a live model from `mp_load`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_device_id(model: *const Model) -> i32 {
    // SAFETY: per this function's contract.
    guard(-1, || Ok(unsafe { model_ref(model) }?.device.1))
}

/// # Safety
/// `model` is NULL or a live model from `mp_load`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_hidden_size(model: *const Model) -> usize {
    guard(0, || {
        // SAFETY: per this function's contract.
        let m = unsafe { model_ref(model) }?;
        Ok(m.m.pack.pack.manifest.model.hidden_size as usize)
    })
}

/// # Safety
/// `model` is NULL or a live model from `mp_load`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_tensor_count(model: *const Model) -> usize {
    // SAFETY: per this function's contract.
    guard(0, || Ok(unsafe { model_ref(model) }?.tensors.len()))
}

/// # Safety
/// `model` is NULL or a live model from `mp_load`; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_tensor_at(
    model: *const Model,
    index: usize,
    out: *mut MpTensor,
) -> i32 {
    guard(-1, || {
        // SAFETY: per this function's contract.
        let m = unsafe { model_ref(model) }?;
        let t = m
            .tensors
            .get(index)
            .ok_or_else(|| format!("tensor {index} of {}", m.tensors.len()))?;
        if out.is_null() {
            return Err("out is NULL".into());
        }
        let mut shape = [0u64; MAX_DIMS];
        shape[..t.shape.len()].copy_from_slice(&t.shape);
        // SAFETY: `out` is writable (the caller's promise), checked non-NULL.
        unsafe {
            out.write(MpTensor {
                name: t.name.as_ptr(),
                ty: t.ty.as_ptr(),
                source_type: t.source_type.as_ptr(),
                ffn_json: t.ffn_json.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
                data: t.data,
                bytes: t.bytes,
                ndim: t.shape.len() as i32,
                shape,
            })
        };
        Ok(0)
    })
}

/// # Safety
/// `model` is NULL or a live model from `mp_load`; `name` NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_tensor_index(model: *const Model, name: *const c_char) -> i64 {
    guard(-1, || {
        // SAFETY: per this function's contract.
        let (m, name) = unsafe { (model_ref(model)?, arg(name, "name")?) };
        m.tensors
            .iter()
            .position(|t| t.name.as_bytes() == name.as_bytes())
            .map(|i| i as i64)
            .ok_or_else(|| format!("no device tensor named {name:?} in the model"))
    })
}

/// The model behind a mutable pointer, or why not.
///
/// # Safety
/// `model` is NULL, a live model from `mp_load` used by this thread alone, or a pointer the
/// registry does not hold.
unsafe fn model_mut<'a>(model: *mut Model) -> Result<&'a mut Model, String> {
    if model.is_null() || !live(model, false) {
        return Err(not_live(model));
    }
    // SAFETY: a live model (checked in the registry above), used by this thread alone.
    Ok(unsafe { &mut *model })
}

/// # Safety
/// `model` a live model used by this thread alone; `x` and `y` `rows * hidden` f32 each, in
/// host memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_forward(
    model: *mut Model,
    layer: usize,
    x: *const f32,
    y: *mut f32,
    rows: usize,
) -> i32 {
    guard(-1, || {
        // SAFETY: per this function's contract.
        let m = &mut unsafe { model_mut(model) }?.m;
        let hidden = m.pack.pack.manifest.model.hidden_size as usize;
        let n = rows
            .checked_mul(hidden)
            .and_then(|n| n.checked_mul(4))
            .ok_or("rows * hidden overflows")?;
        if rows == 0 || x.is_null() || y.is_null() {
            return Err("forward: rows is 0 or x or y is NULL".into());
        }
        // SAFETY: `x` and `y` hold `rows * hidden` f32 (`n` bytes) each (the caller's promise),
        // checked non-NULL.
        let (xs, ys) = unsafe {
            (
                std::slice::from_raw_parts(x as *const u8, n),
                std::slice::from_raw_parts_mut(y as *mut u8, n),
            )
        };
        m.forward_host(layer, xs, ys, rows)
            .map(|()| 0)
            .map_err(|e| e.to_string())
    })
}

/// # Safety
/// `model` a live CUDA model used by this thread alone; `x` and `y` device addresses of
/// `rows * hidden` f32 each; `stream` a CUstream of the model's device (or 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mp_forward_device(
    model: *mut Model,
    layer: usize,
    x: u64,
    y: u64,
    rows: usize,
    stream: u64,
) -> i32 {
    guard(-1, || {
        // SAFETY: per this function's contract.
        let model = unsafe { model_mut(model) }?;
        if model.device.0 != DEVICE_CUDA {
            return Err("mp_forward_device: the model is not on a CUDA device (mp_forward)".into());
        }
        let m = &mut model.m;
        let hidden = m.pack.pack.manifest.model.hidden_size as usize;
        let bytes = rows
            .checked_mul(hidden)
            .and_then(|n| n.checked_mul(4))
            .ok_or("rows * hidden overflows")? as u64;
        if rows == 0 || x == 0 || y == 0 {
            return Err("forward: rows is 0 or x or y is 0".into());
        }
        let (x, y) = (DevicePtr { addr: x, bytes }, DevicePtr { addr: y, bytes });
        m.forward_device(layer, x, y, rows, stream)
            .map(|()| 0)
            .map_err(|e| e.to_string())
    })
}
