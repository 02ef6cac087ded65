//! Tensor maps for the bulk tensor copy engine (TMA): [`Tmap`] checked and encoded with the
//! driver's `cuTensorMapEncodeTiled` into the 128-byte `CUtensorMap` a kernel takes by value.

use super::cuerr;
use crate::gpu::{GpuError, GpuResult, Tmap};
use cudarc::driver::sys as cus;

/// Bytes of one swizzle row: the 128-byte swizzle's span, the widest box row it allows.
const SWIZZLE_BYTES: usize = 128;
/// The driver's limit on a box dimension.
const MAX_BOX: usize = 256;

/// The driver's rules for [`encode_tmap`], checked here so a refusal names the field.
pub fn check_tmap(t: &Tmap) -> GpuResult<()> {
    let bad = |what: String| GpuError::Invalid(format!("tensor map {t:?}: {what}"));
    if !t.base.addr.is_multiple_of(16) {
        return Err(bad("base not 16-byte aligned".into()));
    }
    if t.row_bytes == 0 || !t.row_bytes.is_multiple_of(16) {
        return Err(bad("row bytes not a positive multiple of 16".into()));
    }
    if t.rows == 0 || t.rows > u32::MAX as usize {
        return Err(bad("rows not in 1..2^32".into()));
    }
    if t.box_rows == 0 || t.box_rows > MAX_BOX {
        return Err(bad(format!("box rows not in 1..={MAX_BOX}")));
    }
    if t.box_bytes == 0 || t.box_bytes > SWIZZLE_BYTES || !t.box_bytes.is_multiple_of(16) {
        return Err(bad(format!(
            "box bytes not a multiple of 16 in 16..={SWIZZLE_BYTES}"
        )));
    }
    let bytes = t
        .row_bytes
        .checked_mul(t.rows)
        .ok_or_else(|| bad("size overflows".into()))?;
    if bytes as u64 > t.base.bytes {
        return Err(bad(format!(
            "{bytes} bytes past its {}-byte allocation",
            t.base.bytes
        )));
    }
    Ok(())
}

/// `t` as a u8 2-D tensor map in the 128-byte swizzle, zeros past its edges; refused (naming the
/// field) where the driver's rules would refuse it: a base not 16-byte aligned, a row stride not a
/// multiple of 16, an empty or oversized box, a box row wider than the swizzle, sizes past the
/// allocation.
pub(super) fn encode_tmap(t: &Tmap) -> GpuResult<cus::CUtensorMap> {
    check_tmap(t)?;
    let dims: [u64; 2] = [t.row_bytes as u64, t.rows as u64];
    // The stride of every dimension but the innermost.
    let strides: [u64; 1] = [t.row_bytes as u64];
    let boxes: [u32; 2] = [t.box_bytes as u32, t.box_rows as u32];
    let elem_strides: [u32; 2] = [1, 1];
    let mut map = cus::CUtensorMap { opaque: [0; 16] };
    // SAFETY: FFI; every pointer is a live local of the rank (2) the call reads, and `map` is
    // the 64-byte aligned output it writes; the global address is only recorded.
    unsafe {
        cus::cuTensorMapEncodeTiled(
            &mut map,
            cus::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            2,
            t.base.addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            cus::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            cus::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            cus::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            cus::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    }
    .result()
    .map_err(cuerr("cuTensorMapEncodeTiled"))?;
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::check_tmap;
    use crate::gpu::{DevicePtr, Tmap};

    #[test]
    fn tensor_maps_the_driver_would_refuse_are_refused_by_field() {
        let ok = Tmap {
            base: DevicePtr {
                addr: 1 << 20,
                bytes: 640 * 512,
            },
            row_bytes: 640,
            rows: 512,
            box_rows: 128,
            box_bytes: 128,
        };
        check_tmap(&ok).unwrap();
        let cases: [(Tmap, &str); 6] = [
            (
                Tmap {
                    base: DevicePtr {
                        addr: ok.base.addr + 8,
                        ..ok.base
                    },
                    ..ok
                },
                "16-byte aligned",
            ),
            (
                Tmap {
                    row_bytes: 600,
                    ..ok
                },
                "multiple of 16",
            ),
            (Tmap { rows: 0, ..ok }, "rows"),
            (
                Tmap {
                    box_rows: 257,
                    ..ok
                },
                "box rows",
            ),
            (
                Tmap {
                    box_bytes: 256,
                    ..ok
                },
                "box bytes",
            ),
            (Tmap { rows: 513, ..ok }, "allocation"),
        ];
        for (t, want) in cases {
            let e = check_tmap(&t).unwrap_err().to_string();
            assert!(e.contains(want), "{t:?}: {e}");
        }
    }
}
