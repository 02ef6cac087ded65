//! DLPack export of a loaded pack's device tensors: a `dltensor` capsule per tensor that torch
//! (`torch.from_dlpack`) and numpy (`numpy.from_dlpack`, host tensors) take without a copy.
//!
//! The struct layouts are DLPack's (`dlpack.h`, the v0.8 ABI that `__dlpack__` without a
//! version request exchanges): `DLManagedTensor { DLTensor dl_tensor; void *manager_ctx;
//! void (*deleter)(DLManagedTensor *); }` and `DLTensor { void *data; DLDevice device; int32_t
//! ndim; DLDataType dtype; int64_t *shape; int64_t *strides; uint64_t byte_offset; }`. The
//! capsule protocol: the producer names the capsule `dltensor`; a consumer that takes it renames
//! it `used_dltensor` and calls the deleter when its tensor dies; a capsule destroyed while
//! still named `dltensor` was never taken, and its destructor calls the deleter.

use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex};

/// `DLDeviceType`: host memory (CUDA device memory is 2; `Device::dlpack` gives both).
pub const KDL_CPU: i32 = 1;

/// `DLDataTypeCode` values.
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const KDL_BFLOAT: u8 = 4;

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// What one export owns: the DLPack struct (first, so a pointer to it is a pointer to this),
/// the shape it points at, and a reference to the loaded pack that keeps the device memory
/// alive until the consumer's tensor dies.
#[repr(C)]
struct Managed<T: Send + 'static> {
    tensor: DlManagedTensor,
    shape: Vec<i64>,
    _owner: Arc<Mutex<T>>,
}

/// The DLPack dtype of a pack type (by the names `format!("{:?}", GgmlType)` gives), or `None`
/// for types exported as raw bytes (quantized blocks, FFN blobs, F8).
pub fn dtype_of(ty: &str) -> Option<(u8, u8)> {
    Some(match ty {
        "F32" => (KDL_FLOAT, 32),
        "F16" => (KDL_FLOAT, 16),
        "F64" => (KDL_FLOAT, 64),
        "BF16" => (KDL_BFLOAT, 16),
        "I8" => (KDL_INT, 8),
        "I16" => (KDL_INT, 16),
        "I32" => (KDL_INT, 32),
        "I64" => (KDL_INT, 64),
        _ => return None,
    })
}

/// One tensor to export: where its bytes are, on which device, its dtype `(code, bits)` and
/// shape (row-major, contiguous).
pub struct Export {
    pub data: *mut u8,
    pub device: (i32, i32),
    pub dtype: (u8, u8),
    pub shape: Vec<i64>,
}

/// A byte view: `(KDL_UINT, 8)`, shape `[bytes]`.
pub const BYTES: (u8, u8) = (KDL_UINT, 8);

const NAME: &CStr = c"dltensor";

unsafe extern "C" fn deleter<T: Send + 'static>(m: *mut DlManagedTensor) {
    if !m.is_null() {
        // SAFETY: `m` came from `Box::into_raw` of a `Managed<T>` in `capsule` (its first field),
        // and DLPack calls the deleter once.
        drop(unsafe { Box::from_raw(m as *mut Managed<T>) });
    }
}

unsafe extern "C" fn capsule_destructor<T: Send + 'static>(cap: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed; a capsule still named
    // `dltensor` was never taken by a consumer, so its tensor is still ours to delete.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(cap, NAME.as_ptr()) == 1 {
            let m = pyo3::ffi::PyCapsule_GetPointer(cap, NAME.as_ptr()) as *mut DlManagedTensor;
            deleter::<T>(m);
        } else {
            // A consumer renamed it (`used_dltensor`): clear any error PyCapsule_IsValid set.
            pyo3::ffi::PyErr_Clear();
        }
    }
}

/// A `dltensor` capsule for `e`, holding `owner` until the consumer's tensor dies.
pub fn capsule<T: Send + 'static>(
    py: pyo3::Python<'_>,
    e: Export,
    owner: Arc<Mutex<T>>,
) -> pyo3::PyResult<pyo3::PyObject> {
    let mut m = Box::new(Managed {
        tensor: DlManagedTensor {
            dl_tensor: DlTensor {
                data: e.data as *mut c_void,
                device: DlDevice {
                    device_type: e.device.0,
                    device_id: e.device.1,
                },
                ndim: e.shape.len() as i32,
                dtype: DlDataType {
                    code: e.dtype.0,
                    bits: e.dtype.1,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                // Null strides: compact row-major.
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter::<T>),
        },
        shape: e.shape,
        _owner: owner,
    });
    m.tensor.dl_tensor.shape = m.shape.as_mut_ptr();
    let raw = Box::into_raw(m);
    // SAFETY: `raw` points at a live `Managed<T>` whose first field is the DLManagedTensor; the
    // capsule's destructor (or the consumer, through the deleter) frees it exactly once.
    let cap = unsafe {
        pyo3::ffi::PyCapsule_New(
            raw as *mut c_void,
            NAME.as_ptr(),
            Some(capsule_destructor::<T>),
        )
    };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so `raw` is still ours alone.
        unsafe { deleter::<T>(raw as *mut DlManagedTensor) };
        return Err(pyo3::PyErr::fetch(py));
    }
    // SAFETY: a new reference just returned by PyCapsule_New.
    Ok(unsafe { pyo3::PyObject::from_owned_ptr(py, cap) })
}

/// A tensor another library exported (a `dltensor` capsule), borrowed for one call: taken from
/// its capsule (renamed `used_dltensor`) and given back (its deleter called) on drop.
pub struct Imported {
    managed: *mut DlManagedTensor,
    /// Where its first element is.
    pub data: *mut u8,
    /// `(device type, id)`.
    pub device: (i32, i32),
    /// `(code, bits, lanes)`.
    pub dtype: (u8, u8, u16),
    /// Its shape.
    pub shape: Vec<i64>,
    /// Whether its elements lie in row-major order with no gaps (strides absent or compact).
    pub contiguous: bool,
}

const USED: &CStr = c"used_dltensor";

/// The most dimensions an imported tensor may have (the C ABI's `MP_MAX_DIMS`).
pub const MAX_IMPORT_DIMS: usize = 8;

/// Take the tensor of `capsule` (a `dltensor` capsule from `__dlpack__`).
pub fn import(capsule: &pyo3::Bound<'_, pyo3::PyAny>) -> pyo3::PyResult<Imported> {
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object (borrowed from `capsule`); the checks below hold the
    // capsule's name and pointer before anything is read through them.
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(cap, NAME.as_ptr()) != 1 {
            pyo3::ffi::PyErr_Clear();
            return Err(crate::errors::ArgumentError::new_err(
                "expected an unused DLPack capsule named \"dltensor\" (from __dlpack__())",
            ));
        }
        let m = pyo3::ffi::PyCapsule_GetPointer(cap, NAME.as_ptr()) as *mut DlManagedTensor;
        if m.is_null() {
            return Err(pyo3::PyErr::fetch(capsule.py()));
        }
        let t = &(*m).dl_tensor;
        // Checked before any read through the tensor's pointers: its rank, then its shape
        // array, then its data pointer (a capsule is another library's, possibly a bad one). A
        // refused capsule is left as it was, its producer's destructor frees it.
        let refuse = |what: String| -> pyo3::PyResult<Imported> {
            Err(crate::errors::ArgumentError::new_err(format!(
                "DLPack capsule: {what}"
            )))
        };
        if !(0..=MAX_IMPORT_DIMS as i32).contains(&t.ndim) {
            return refuse(format!("ndim {} (0 to {MAX_IMPORT_DIMS} taken)", t.ndim));
        }
        let ndim = t.ndim as usize;
        if ndim > 0 && t.shape.is_null() {
            return refuse(format!("ndim {ndim} with a NULL shape"));
        }
        let shape: Vec<i64> = if ndim == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(t.shape, ndim).to_vec()
        };
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return refuse(format!("shape {shape:?} has a negative extent {d}"));
        }
        let elems = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        let bytes = elems.and_then(|n| {
            let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
            n.checked_mul(bits).map(|b| b.div_ceil(8))
        });
        let Some(bytes) = bytes.filter(|&b| b <= isize::MAX as u64) else {
            return refuse(format!(
                "shape {shape:?} of {}-bit elements overflows",
                t.dtype.bits
            ));
        };
        if bytes > 0 && t.data.is_null() {
            return refuse(format!("data is NULL for a tensor of shape {shape:?}"));
        }
        if (t.data as u64).checked_add(t.byte_offset).is_none() {
            return refuse(format!("byte_offset {} overflows", t.byte_offset));
        }
        let contiguous = t.strides.is_null() || {
            let strides = std::slice::from_raw_parts(t.strides, ndim);
            let mut want = 1i64;
            let mut ok = true;
            for i in (0..ndim).rev() {
                ok &= shape[i] == 1 || strides[i] == want;
                want = want.saturating_mul(shape[i]);
            }
            ok
        };
        let data = (t.data as *mut u8).wrapping_add(t.byte_offset as usize);
        let imported = Imported {
            managed: m,
            data,
            device: (t.device.device_type, t.device.device_id),
            dtype: (t.dtype.code, t.dtype.bits, t.dtype.lanes),
            shape,
            contiguous,
        };
        // Taken: the producer's destructor leaves it to us (our drop calls the deleter).
        if pyo3::ffi::PyCapsule_SetName(cap, USED.as_ptr()) != 0 {
            std::mem::forget(imported);
            return Err(pyo3::PyErr::fetch(capsule.py()));
        }
        Ok(imported)
    }
}

impl Imported {
    /// Whether it is a contiguous f32 `[rows, cols]` matrix on `device`; the rows, or why not.
    pub fn f32_rows(&self, device: (i32, i32), cols: usize, what: &str) -> Result<usize, String> {
        if self.dtype != (KDL_FLOAT, 32, 1) {
            return Err(format!(
                "{what}: dtype (code {}, bits {}, lanes {}) is not float32",
                self.dtype.0, self.dtype.1, self.dtype.2
            ));
        }
        if self.device != device {
            return Err(format!(
                "{what}: on DLPack device {:?}, the pack is loaded on {device:?}",
                self.device
            ));
        }
        match self.shape[..] {
            [rows, c] if rows > 0 && c == cols as i64 && self.contiguous => Ok(rows as usize),
            _ => Err(format!(
                "{what}: shape {:?}{} is not a contiguous [rows, {cols}]",
                self.shape,
                if self.contiguous { "" } else { " (strided)" }
            )),
        }
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the DLManagedTensor taken in `import`, given back once.
        unsafe {
            if let Some(d) = (*self.managed).deleter {
                d(self.managed);
            }
        }
    }
}
