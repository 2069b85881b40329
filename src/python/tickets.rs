//! What reads started in the background hand back: tickets whose result
//! is taken once, the zero-copy buffer a host read lends, and the eventfd
//! an event loop watches for finished reads.

use std::sync::Arc;

use numpy::PyArray1;
use pyo3::ffi;
use pyo3::prelude::*;

use super::args::seconds;
use crate::agent::ReadError;
use crate::background::{DoneSignal, Taken, Ticket};
use crate::cuda::{Destination, DestinationCell};
use crate::errors::Error;
use crate::reader::{Lease, Pixels};

/// Pixels left in a registered receive slot, exposed through the buffer
/// protocol (numpy.frombuffer keeps this object, and so the slot, alive).
#[pyclass(module = "pixelwire._native", frozen)]
pub struct PixelBuffer {
    lease: Lease,
}

#[pymethods]
impl PixelBuffer {
    unsafe fn __getbuffer__(
        slf: PyRef<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let ptr = slf.lease.as_mut_ptr();
        let len = slf.lease.len() as ffi::Py_ssize_t;
        // SAFETY: `view` comes from the interpreter; the memory stays valid
        // while the exporter (this object, referenced by the view) lives.
        if unsafe { ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr.cast(), len, 0, flags) } != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.lease.len()
    }
}

pub(super) fn pixels_for_python(py: Python<'_>, pixels: Pixels) -> PyResult<Bound<'_, PyAny>> {
    match pixels {
        Pixels::Owned(pixels) => Ok(PyArray1::from_vec(py, pixels).into_any()),
        Pixels::Leased(lease) => Ok(Bound::new(py, PixelBuffer { lease })?.into_any()),
    }
}

/// A read started by `NativeReader.start_read`; its result is taken once.
#[pyclass(module = "pixelwire._native", frozen)]
pub struct ReadTicket {
    pub(super) inner: Ticket<crate::errors::Result<Pixels>>,
}

#[pymethods]
impl ReadTicket {
    /// What `read` would return (or raise), once the read has finished:
    /// waited for up to `timeout` seconds without sleeping (a budget of
    /// microseconds, for the caller's own thread), or as long as the read
    /// takes when `timeout` is None. Returns None if the read has not
    /// finished within `timeout`. The GIL is released while waiting.
    #[pyo3(signature = (timeout = None))]
    fn wait<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        match take(py, &self.inner, timeout)? {
            Some(outcome) => Ok(Some(pixels_for_python(py, outcome?)?)),
            None => Ok(None),
        }
    }

    /// Whether the read has finished.
    #[getter]
    fn done(&self) -> bool {
        self.inner.is_done()
    }
}

/// A ticket's result, waited for as `ReadTicket.wait` says; None if not
/// finished within `timeout`.
fn take<T>(py: Python<'_>, ticket: &Ticket<T>, timeout: Option<f64>) -> PyResult<Option<T>>
where
    T: Send,
{
    let taken = match timeout {
        Some(budget) => {
            let budget = seconds(budget, "timeout")?;
            py.detach(|| ticket.take_within(budget))
        }
        None => py.detach(|| ticket.take()),
    };
    match taken {
        Taken::Value(outcome) => Ok(Some(outcome)),
        Taken::NotFinished => Ok(None),
        Taken::Panicked => Err(Error::Transfer(
            "the read's background thread panicked (a bug in pixelwire): no pixels".into(),
        )
        .into()),
        Taken::AlreadyTaken => {
            Err(Error::InvalidArgument("this read's result was already taken".into()).into())
        }
    }
}

/// A read into CUDA memory started by `NativeReader.start_read_to_cuda`:
/// given its device memory with `copy_into` (while the READ runs); its
/// outcome is taken once.
#[pyclass(module = "pixelwire._native", frozen)]
pub struct DeviceReadTicket {
    pub(super) inner: Ticket<Result<(), ReadError>>,
    pub(super) destination: Arc<DestinationCell>,
}

#[pymethods]
impl DeviceReadTicket {
    /// The device memory at `device_addr` (room for the image, on the
    /// read's device) the landed chunks are copied into; `ready_on`: a
    /// stream of that device (a `cudaStream_t` handle) made to wait for the
    /// copies once they are all queued, so it sees the pixels without a
    /// wait of its own. Given once; the first chunk to land waits for it.
    #[pyo3(signature = (device_addr, *, ready_on = None))]
    fn copy_into(&self, device_addr: u64, ready_on: Option<usize>) -> PyResult<()> {
        Ok(self.destination.give(Destination {
            addr: device_addr,
            ready_on,
        })?)
    }

    /// Says the read gets no device memory (the caller could not allocate
    /// it): the READ still ends, nothing is copied, and the read fails.
    /// Dropping the ticket without `copy_into` does the same.
    fn withhold(&self) {
        self.destination.withhold();
    }

    /// True once the read has ended well and its copies are queued (the
    /// device bytes are the published ones in the stream's order, and the
    /// `ready_on` stream waits for them); raises the read's error (with
    /// `may_land`; every copy has ended) otherwise; None if it has not
    /// finished within `timeout` (waited for as `ReadTicket.wait`).
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<bool>> {
        match take(py, &self.inner, timeout)? {
            Some(outcome) => Ok(outcome.map(|()| Some(true))?),
            None => Ok(None),
        }
    }

    /// Whether the read has finished.
    #[getter]
    fn done(&self) -> bool {
        self.inner.is_done()
    }
}

impl Drop for DeviceReadTicket {
    fn drop(&mut self) {
        // A read whose caller let go before giving it device memory must
        // not wait for it until the timeout.
        self.destination.withhold();
    }
}

/// A file descriptor that reads started with it make readable when they
/// finish (an eventfd): an event loop watches it (`loop.add_reader`) and
/// takes the finished tickets' results in place, with no thread of its own
/// waiting for each read. It stays open while any read started with it
/// runs.
#[pyclass(module = "pixelwire._native", frozen)]
pub struct ReadSignal {
    pub(super) inner: Arc<DoneSignal>,
}

#[pymethods]
impl ReadSignal {
    #[new]
    fn new() -> PyResult<ReadSignal> {
        let signal = DoneSignal::new().map_err(|e| {
            Error::Transfer(format!("cannot make an eventfd for read completions: {e}"))
        })?;
        Ok(ReadSignal {
            inner: Arc::new(signal),
        })
    }

    /// The descriptor to watch for reading.
    fn fileno(&self) -> i32 {
        self.inner.fd()
    }

    /// Makes it unreadable until the next read finishes.
    fn clear(&self) {
        self.inner.clear();
    }
}

pub(super) fn raise(signal: Option<Arc<DoneSignal>>) {
    if let Some(signal) = signal {
        signal.raise();
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PixelBuffer>()?;
    m.add_class::<ReadTicket>()?;
    m.add_class::<ReadSignal>()?;
    m.add_class::<DeviceReadTicket>()?;
    Ok(())
}
