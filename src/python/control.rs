//! `BatchControl`: the handle that cancels a running `publish_many` batch,
//! a video publish, or a video's open and read.

use std::sync::Arc;

use pyo3::prelude::*;

use crate::publisher::BatchControl;

/// A handle on a running `publish_many` batch, for `NativePublisher.cancel`.
#[pyclass(module = "pixelwire._native", frozen, name = "BatchControl")]
pub struct NativeBatchControl {
    pub(super) inner: Arc<BatchControl>,
}

#[pymethods]
impl NativeBatchControl {
    #[new]
    fn new() -> Self {
        NativeBatchControl {
            inner: Arc::new(BatchControl::default()),
        }
    }

    #[getter]
    fn cancelled(&self) -> bool {
        self.inner.is_cancelled()
    }

    /// Cancels work that publishes nothing (a `VideoCapture` opened or read
    /// with this control stops within a frame); a publisher's batch is
    /// cancelled with `NativePublisher.cancel`, which also frees what it
    /// published.
    fn cancel(&self) {
        self.inner.stop();
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeBatchControl>()?;
    Ok(())
}
