//! The package's exceptions: `Error`, a `ValueError` (code that caught `ValueError` before
//! still catches every one), and one subclass per way a call fails, chosen by the library's
//! error variant. Every message names the file, tensor and field where the library does.

use metrale_pack::gpu::GpuError;
use pyo3::create_exception;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

create_exception!(
    metrale_pack,
    Error,
    PyValueError,
    "Any error of metrale_pack; its message names the file, tensor and field."
);
create_exception!(
    metrale_pack,
    FormatError,
    Error,
    "A file that is not what its format says: truncated, corrupt, or contradicting itself."
);
create_exception!(
    metrale_pack,
    UnsupportedError,
    Error,
    "A file, format or request this tool does not read or serve (yet); the message names it."
);
create_exception!(
    metrale_pack,
    IoError,
    Error,
    "The file system: a file that cannot be read or written, an output refused because it is an input, a file that changed while it was read."
);
create_exception!(
    metrale_pack,
    DeviceError,
    Error,
    "The GPU runtime: no device, a driver or cuBLAS error, a kernel that did not load."
);
create_exception!(
    metrale_pack,
    ArgumentError,
    Error,
    "An argument out of range: max_rows past the limit, a layer or tensor the pack lacks, rows of the wrong shape, an unknown name."
);

/// The library's error as the exception of its kind.
pub fn lib(e: metrale_pack::Error) -> PyErr {
    use metrale_pack::Error as E;
    let m = e.to_string();
    match e {
        E::Io { .. } | E::Write { .. } | E::Output { .. } | E::Changed { .. } => {
            IoError::new_err(m)
        }
        E::Unsupported { .. } | E::Register { .. } | E::Version { .. } | E::BigEndian { .. } => {
            UnsupportedError::new_err(m)
        }
        E::Argument { .. } => ArgumentError::new_err(m),
        E::Gpu(g) => gpu(g),
        E::Interrupted { .. } => Error::new_err(m),
        _ => FormatError::new_err(m),
    }
}

/// The runtime's error as the exception of its kind: the device's own failures, or a call
/// the loaded layers cannot take.
pub fn gpu(e: GpuError) -> PyErr {
    let m = e.to_string();
    match e {
        GpuError::NoDevice(_)
        | GpuError::MissingKernel { .. }
        | GpuError::Compile { .. }
        | GpuError::Cuda { .. } => DeviceError::new_err(m),
        GpuError::NotServed(_) => UnsupportedError::new_err(m),
        GpuError::Shape(_) | GpuError::Order(_) | GpuError::Invalid(_) => ArgumentError::new_err(m),
    }
}

/// An argument this package refuses itself.
pub fn arg(m: impl std::fmt::Display) -> PyErr {
    ArgumentError::new_err(m.to_string())
}

/// Any other failure (a JSON encoding of the library's own values).
pub fn other(m: impl std::fmt::Display) -> PyErr {
    Error::new_err(m.to_string())
}

/// Add the exceptions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("FormatError", py.get_type::<FormatError>())?;
    m.add("UnsupportedError", py.get_type::<UnsupportedError>())?;
    m.add("IoError", py.get_type::<IoError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("ArgumentError", py.get_type::<ArgumentError>())?;
    Ok(())
}
