//! Argument conversions every binding shares: encoded input and durations.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Encoded input: `bytes` is borrowed as is; anything else exposing the
/// buffer protocol is copied once, so no other thread can change it while
/// the GIL is released.
pub enum Encoded<'py> {
    Borrowed(Bound<'py, PyBytes>),
    Owned(Vec<u8>),
}

impl Encoded<'_> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Encoded::Borrowed(b) => b.as_bytes(),
            Encoded::Owned(v) => v,
        }
    }
}

impl<'py> FromPyObject<'py> for Encoded<'py> {
    fn extract_bound(obj: &Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(b) = obj.downcast::<PyBytes>() {
            return Ok(Encoded::Borrowed(b.clone()));
        }
        let buffer = pyo3::buffer::PyBuffer::<u8>::get(obj).map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "data must be bytes, bytearray or memoryview, not {}",
                obj.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        Ok(Encoded::Owned(buffer.to_vec(obj.py())?))
    }
}

/// A duration argument in seconds, checked.
pub fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        crate::errors::Error::InvalidArgument(format!(
            "{what} must be a non-negative number of seconds"
        ))
        .into()
    })
}
