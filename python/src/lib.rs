//! `metrale_pack._native`: the Python package's native part. A pack opened once and read from
//! its map: the manifest (as JSON), the tensor list, a tensor decoded as `metrale-pack dump`
//! decodes it (or its stored bytes), `verify` as `verify --json` reports it; `convert` with the
//! CLI's layout choice; and `load` through the engine loader onto a CUDA device or the host
//! backend, its device tensors exported through DLPack (torch and numpy take them without a
//! copy). The wrapper (`metrale_pack/__init__.py`) turns the JSON into dicts and the bytes into
//! numpy arrays.

mod dlpack;
mod errors;

use metrale_pack::gpu::Device;
use metrale_pack::gpu::host::HostBackend;
use metrale_pack::loader::{EngineOptions, LoadedModel};
use metrale_pack::model::Model;
use metrale_pack::options::{CONVERT, ConvertRequest};
use metrale_pack::pack::{self, Dumped};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

/// A pack opened (header parsed and checked, the file mapped once): every method reads the
/// file opened here, even after the path is replaced.
#[pyclass(frozen, module = "metrale_pack._native")]
struct Pack {
    path: PathBuf,
    opened: pack::Opened,
}

impl Pack {
    /// The pack (validated when it was opened).
    fn pack(&self) -> &pack::Pack {
        self.opened.pack().expect("checked when opened")
    }
}

#[pymethods]
impl Pack {
    #[new]
    fn new(path: PathBuf) -> PyResult<Self> {
        let opened = pack::Opened::open(&path).map_err(errors::lib)?;
        opened.pack().map_err(errors::lib)?;
        Ok(Pack { path, opened })
    }

    /// The manifest as JSON (the `metrale.pack.manifest` object).
    fn manifest_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.pack().manifest).map_err(errors::other)
    }

    /// Every tensor's name, in file order.
    fn tensor_names(&self) -> Vec<String> {
        self.pack()
            .manifest
            .tensors
            .iter()
            .map(|e| e.name.to_string())
            .collect()
    }

    /// Tensor `name` as `(bytes, shape, dtype)`: decoded to little-endian f32 (`dtype` "f32",
    /// an FFN blob through its layout, padding removed), or with `decode=False` its stored
    /// bytes (`dtype` "u8", shape `[len]`).
    #[pyo3(signature = (name, decode = true))]
    fn tensor<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        decode: bool,
    ) -> PyResult<(Bound<'py, PyBytes>, Vec<usize>, &'static str)> {
        let d = py
            .allow_threads(|| self.opened.dump(name, !decode))
            .map_err(errors::lib)?;
        Ok(match d {
            Dumped::Raw(b) => (PyBytes::new(py, &b), vec![b.len()], "u8"),
            Dumped::F32 { values, shape, .. } => {
                let b: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (PyBytes::new(py, &b), shape, "f32")
            }
        })
    }

    /// Every check of `verify --json` as JSON: checksums, padding, and with `source` every
    /// tensor re-derived from that checkpoint.
    #[pyo3(signature = (source = None))]
    fn verify(&self, py: Python<'_>, source: Option<PathBuf>) -> PyResult<String> {
        let r = py
            .allow_threads(|| pack::verify_report(self.pack(), &self.path, source.as_deref()))
            .map_err(errors::lib)?;
        serde_json::to_string(&r).map_err(errors::other)
    }
}

/// Convert the checkpoint `src` into a pack at `out`, as `metrale-pack convert` does, with the
/// options `options` (pairs of a name of `options::CONVERT` and its value in words); returns
/// the pack's manifest as JSON. The convert runs on its own thread while this one waits
/// without the GIL, calls `progress(done, total)` (source bytes) when the convert has moved,
/// and checks for signals: Ctrl-C (any signal handler that raises) or an exception from
/// `progress` stops the convert before its next tensor, its temporary file is removed,
/// nothing is written at `out`, and the exception is raised.
#[pyfunction]
#[pyo3(signature = (src, out, options, progress = None))]
fn convert(
    py: Python<'_>,
    src: PathBuf,
    out: PathBuf,
    options: Vec<(String, String)>,
    progress: Option<PyObject>,
) -> PyResult<String> {
    let mut req = ConvertRequest::default();
    for (name, value) in &options {
        req.set(name, value).map_err(errors::lib)?;
    }
    let model = Model::open(&src).map_err(errors::lib)?;
    let m = run_stoppable(py, progress.as_ref(), |report, stop| {
        req.convert(model, &out, report, stop)
    })?;
    serde_json::to_string(&m).map_err(errors::other)
}

/// The options `convert` takes (`options::CONVERT`), each as (name, kind, help): kind is
/// `switch`, `count`, `words`, `path` or `choice:A|B`.
#[pyfunction]
fn convert_options() -> Vec<(&'static str, String, &'static str)> {
    CONVERT
        .iter()
        .map(|o| (o.name, o.kind.describe(), o.help))
        .collect()
}

/// Run `job` (a convert given a progress sink and a stop flag) on a thread of its own while
/// this thread, the caller's, waits without the GIL in steps of [`POLL`]: after each it calls
/// `progress` with the latest figures (when they moved) and checks for signals. The first
/// exception of either sets the stop flag; the job's own error is raised unless an exception
/// stopped it, which is raised instead (an exception from the call after the job finished is
/// raised too, the pack then written).
fn run_stoppable<T: Send>(
    py: Python<'_>,
    progress: Option<&PyObject>,
    job: impl FnOnce(pack::Progress, &AtomicBool) -> metrale_pack::Result<T> + Send,
) -> PyResult<T> {
    const POLL: Duration = Duration::from_millis(50);
    let stop = AtomicBool::new(false);
    let latest = Mutex::new(None::<(u64, u64)>);
    let report = |done: u64, total: u64| {
        *latest.lock().unwrap_or_else(|e| e.into_inner()) = Some((done, total));
    };
    let mut raised: Option<PyErr> = None;
    let mut shown = None;
    let result = std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        // Behind a lock so the wait can be lent to a thread without the GIL (a receiver is
        // not shared between threads as it is).
        let rx = Mutex::new(rx);
        let (stop, report) = (&stop, &report);
        s.spawn(move || {
            // A panic is sent as a result (the scope would re-raise it in this thread).
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(report, stop)));
            let _ = tx.send(r);
        });
        loop {
            let got = py.allow_threads(|| {
                rx.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .recv_timeout(POLL)
            });
            let now = *latest.lock().unwrap_or_else(|e| e.into_inner());
            if raised.is_none()
                && now != shown
                && let (Some(cb), Some((done, total))) = (progress, now)
            {
                shown = now;
                if let Err(e) = cb.call1(py, (done, total)) {
                    raised = Some(e);
                }
            }
            if raised.is_none()
                && let Err(e) = py.check_signals()
            {
                raised = Some(e);
            }
            if raised.is_some() {
                stop.store(true, Ordering::Relaxed);
            }
            match got {
                Ok(r) => break Some(r),
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break None,
            }
        }
    });
    if let Some(e) = raised {
        return Err(e);
    }
    match result {
        Some(Ok(r)) => r.map_err(errors::lib),
        Some(Err(_)) | None => Err(errors::other(
            "convert: internal error (a panic in metrale-pack); nothing was written",
        )),
    }
}

/// The process's shared host backend (`load(device="cpu")`): its live allocations count every
/// pack loaded on it.
fn host() -> &'static Arc<HostBackend> {
    HostBackend::shared()
}

/// A device tensor as `Loaded.tensor` returns it: bytes, shape, type, FFN layout descriptor.
type DeviceTensorOut<'py> = (Bound<'py, PyBytes>, Vec<u64>, String, Option<String>);

/// A pack loaded by the crate's engine loader (`LoadedModel::load`): every device tensor
/// copied, every layer installed and checked to forward. The device memory is freed when the
/// handle is closed (or goes) and every tensor exported from it has died.
#[pyclass(module = "metrale_pack._native")]
struct Loaded {
    model: Mutex<Option<Arc<Mutex<LoadedModel>>>>,
    /// The DLPack device: `(1, 0)` for the host backend, `(2, ordinal)` for CUDA.
    device: (i32, i32),
}

impl Loaded {
    fn shared(&self) -> PyResult<Arc<Mutex<LoadedModel>>> {
        let g = self.model.lock().unwrap_or_else(|e| e.into_inner());
        g.clone()
            .ok_or_else(|| errors::other("the loaded pack was closed"))
    }

    fn with<T>(&self, f: impl FnOnce(&LoadedModel) -> PyResult<T>) -> PyResult<T> {
        let m = self.shared()?;
        let g = m.lock().unwrap_or_else(|e| e.into_inner());
        f(&g)
    }
}

#[pymethods]
impl Loaded {
    /// Every device tensor's name, in pack order.
    fn tensor_names(&self) -> PyResult<Vec<String>> {
        self.with(|m| {
            Ok(m.pack
                .device_tensors()
                .map(|t| t.name.to_string())
                .collect())
        })
    }

    /// Device tensor `name` as `(bytes, shape, type, ffn)`: its bytes as the device holds them
    /// (copied back from the host backend), its shape (`[bytes]` for an FFN blob), its type in
    /// the pack (`F32`, `F16`, `BF16`, a quantized ggml type, or `I8` for an FFN blob) and, for
    /// an FFN blob, its manifest entry's layout descriptor as JSON (else `None`).
    fn tensor<'py>(&self, py: Python<'py>, name: &str) -> PyResult<DeviceTensorOut<'py>> {
        self.with(|m| {
            let t = m.device_tensor(name).ok_or_else(|| {
                errors::arg(format!("no device tensor {name:?} in the loaded pack"))
            })?;
            let mut b = vec![0u8; t.ptr.bytes as usize];
            m.backend().download(t.ptr, &mut b).map_err(errors::gpu)?;
            let ffn = match &t.entry.ffn {
                Some(f) => Some(serde_json::to_string(f).map_err(errors::other)?),
                None => None,
            };
            Ok((
                PyBytes::new(py, &b),
                t.shape.clone(),
                format!("{:?}", t.ty),
                ffn,
            ))
        })
    }

    /// Dense FFN layer `layer` on `rows` rows of f32 activations (`x`: little-endian
    /// `[rows, hidden]`), through the arm the routing picks for that many rows (one: decode;
    /// two, three; more: prefill); the output's bytes, `[rows, hidden]` f32.
    fn forward<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
        x: &[u8],
        rows: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let shared = self.shared()?;
        let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = vec![0u8; x.len()];
        g.forward_host(layer, x, &mut out, rows)
            .map_err(errors::gpu)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Dense FFN layer `layer` through the named arm (see `arms`) on `rows` rows of f32
    /// activations (`x`: little-endian `[rows, hidden]`); the output's bytes.
    fn forward_arm<'py>(
        &self,
        py: Python<'py>,
        layer: usize,
        arm: &str,
        x: &[u8],
        rows: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let shared = self.shared()?;
        let g = shared.lock().unwrap_or_else(|e| e.into_inner());
        let hidden = g.pack.pack.manifest.model.hidden_size as usize;
        if rows == 0 || rows.checked_mul(hidden).and_then(|v| v.checked_mul(4)) != Some(x.len()) {
            return Err(errors::arg(format!(
                "forward: {} input bytes are not {rows} rows of {hidden} f32",
                x.len()
            )));
        }
        let xf: Vec<f32> = x
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let y = g.forward_arm(layer, arm, &xf).map_err(errors::lib)?;
        let out: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &out))
    }

    /// The names of the arms layer `layer` can run (empty for a layer the pack lacks).
    fn arms(&self, layer: usize) -> PyResult<Vec<&'static str>> {
        let shared = self.shared()?;
        let g = shared.lock().unwrap_or_else(|e| e.into_inner());
        Ok(g.arm_names(layer).unwrap_or_default())
    }

    /// Device tensor `name` as a DLPack capsule, no copy: its dtype and shape for float and
    /// integer tensors, else (quantized blocks, FFN blobs, F8), or with `raw`, its bytes as
    /// uint8 `[bytes]`. The capsule holds the loaded pack until the consumer's tensor dies.
    #[pyo3(signature = (name, raw = false))]
    fn dlpack(&self, py: Python<'_>, name: &str, raw: bool) -> PyResult<PyObject> {
        let shared = self.shared()?;
        let e = {
            let m = shared.lock().unwrap_or_else(|e| e.into_inner());
            let t = m.device_tensor(name).ok_or_else(|| {
                errors::arg(format!("no device tensor {name:?} in the loaded pack"))
            })?;
            let data = if self.device.0 == dlpack::KDL_CPU {
                host().host_address(t.ptr).map_err(errors::gpu)?
            } else {
                t.ptr.addr as *mut u8
            };
            let bytes = t.ptr.bytes;
            // Typed only for a passthrough tensor whose bytes are the pack type's (an FFN blob,
            // and a source dtype ggml has no type for, are `I8` in the pack: bytes).
            let ty = format!("{:?}", t.ty);
            let typed = dlpack::dtype_of(&ty).filter(|&(_, bits)| {
                let n = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
                !raw && t.entry.ffn.is_none()
                    && t.source_type == ty
                    && n.and_then(|n| n.checked_mul(bits as u64 / 8)) == Some(bytes)
            });
            let (dtype, shape) = match typed {
                Some(d) => (d, t.shape.iter().map(|&d| d as i64).collect()),
                None => (dlpack::BYTES, vec![bytes as i64]),
            };
            dlpack::Export {
                data,
                device: self.device,
                dtype,
                shape,
            }
        };
        dlpack::capsule(py, e, shared)
    }

    /// Dense FFN layer `layer` on the rows of `x` into `out` (each a `dltensor` capsule: f32
    /// `[rows, hidden]`, contiguous, on the load's device), queued on the CUDA stream `stream`
    /// (a `CUstream` handle, torch's `cuda_stream`; 0 the legacy default stream) with no copy of
    /// `x`: the routing's arm for that many rows, then the output copied into `out` on that
    /// stream. On the host backend the rows are copied in and out.
    fn forward_dlpack(
        &self,
        layer: usize,
        x: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        stream: u64,
    ) -> PyResult<()> {
        let (xi, oi) = (dlpack::import(x)?, dlpack::import(out)?);
        let shared = self.shared()?;
        let mut g = shared.lock().unwrap_or_else(|e| e.into_inner());
        let m = &mut *g;
        let hidden = m.pack.pack.manifest.model.hidden_size as usize;
        let rows = xi.f32_rows(self.device, hidden, "x").map_err(errors::arg)?;
        if oi
            .f32_rows(self.device, hidden, "out")
            .map_err(errors::arg)?
            != rows
        {
            return Err(errors::arg(format!(
                "out: {:?} rows, x has {rows}",
                oi.shape.first()
            )));
        }
        let bytes = rows * hidden * 4;
        if self.device.0 == dlpack::KDL_CPU {
            // SAFETY: the exporters' contiguous f32 [rows, hidden] each (checked above), alive
            // until `xi` and `oi` are dropped at the end of this call.
            let (xs, os) = unsafe {
                (
                    std::slice::from_raw_parts(xi.data, bytes),
                    std::slice::from_raw_parts_mut(oi.data, bytes),
                )
            };
            return m.forward_host(layer, xs, os, rows).map_err(errors::gpu);
        }
        let dev = |p: *mut u8| metrale_pack::gpu::DevicePtr {
            addr: p as u64,
            bytes: bytes as u64,
        };
        // `out` is device memory of `bytes` (checked above), kept alive by the caller (torch
        // orders its reuse after this stream's work).
        m.forward_device(layer, dev(xi.data), dev(oi.data), rows, stream)
            .map_err(errors::gpu)
    }

    /// The DLPack device of the tensors: `(1, 0)` host, `(2, ordinal)` CUDA.
    fn dlpack_device(&self) -> (i32, i32) {
        self.device
    }

    /// Let go of the loaded pack: its device memory is freed now, or when the last tensor
    /// exported from it dies.
    fn close(&self) {
        drop(self.model.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// Load the pack at `path` with the crate's engine loader onto `device`: `"cuda"` or
/// `"cuda:N"` a CUDA device (the primary context torch uses too), `"cpu"` the host backend
/// (CI's).
#[pyfunction]
#[pyo3(signature = (path, device = "cpu", verify_checksums = false, max_rows = 16))]
fn load(
    py: Python<'_>,
    path: PathBuf,
    device: &str,
    verify_checksums: bool,
    max_rows: usize,
) -> PyResult<Loaded> {
    let device = Device::parse(device).map_err(errors::arg)?;
    let (backend, dl) = (device.backend().map_err(errors::gpu)?, device.dlpack());
    let opts = EngineOptions {
        verify_checksums,
        max_tokens: max_rows.max(1),
        ..EngineOptions::default()
    };
    let m = py
        .allow_threads(|| LoadedModel::load(&path, backend, &opts))
        .map_err(errors::lib)?;
    Ok(Loaded {
        model: Mutex::new(Some(Arc::new(Mutex::new(m)))),
        device: dl,
    })
}

/// The host backend's live allocations (every buffer of every pack loaded with
/// `device="cpu"` and not yet freed).
#[pyfunction]
fn host_live_allocations() -> usize {
    host().live_allocations()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<Pack>()?;
    m.add_class::<Loaded>()?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(convert_options, m)?)?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(host_live_allocations, m)?)?;
    Ok(())
}
