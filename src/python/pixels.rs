//! Decoded pixels handed to numpy. A large output's array has a
//! [`DecodedPixels`] as its base object, which gives the buffer to the
//! decoder's recycler (`decode::recycle`) once numpy lets go of it, so the
//! next output of that size needs no fresh memory.

use numpy::ndarray::ArrayView3;
use numpy::{PyArray1, PyArray3, PyArrayMethods};
use pyo3::prelude::*;

use crate::decode::{recycle, OutputShape};

/// Owns a decoded image's buffer for as long as an array uses it.
#[pyclass(module = "pixelwire._native", frozen)]
pub struct DecodedPixels {
    buf: Vec<u8>,
}

impl Drop for DecodedPixels {
    fn drop(&mut self) {
        recycle::give_back(std::mem::take(&mut self.buf));
    }
}

/// `pixels` as an (height, width, channels) array, without a copy.
pub fn array<'py>(
    py: Python<'py>,
    pixels: Vec<u8>,
    shape: OutputShape,
) -> PyResult<Bound<'py, PyAny>> {
    let dims = [shape.height, shape.width, shape.channels];
    if pixels.capacity() < recycle::MIN_BYTES {
        return Ok(PyArray1::from_vec(py, pixels).reshape(dims)?.into_any());
    }
    if pixels.len() != shape.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{} bytes of pixels for a {}x{}x{} image",
            pixels.len(),
            shape.height,
            shape.width,
            shape.channels
        )));
    }
    // Moving the Vec into the owner leaves its heap buffer where it is.
    let ptr = pixels.as_ptr();
    let owner = Bound::new(py, DecodedPixels { buf: pixels })?;
    // SAFETY: `ptr` points at `shape.len()` initialised bytes owned by
    // `owner`, which becomes the array's base object and so outlives every
    // view of it; Rust code never reads or writes that buffer again until
    // the owner is dropped, so numpy may write through the array.
    let view = unsafe { ArrayView3::from_shape_ptr(dims, ptr) };
    Ok(unsafe { PyArray3::borrow_from_array(&view, owner.into_any()) }.into_any())
}
