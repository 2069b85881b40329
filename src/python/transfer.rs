//! PyO3 wrappers for the NIXL publisher and reader. Blocking work (decode,
//! waiting for a slot, waiting for a READ) runs with the GIL released; the
//! Python layer runs these calls in worker threads so the event loop never
//! blocks.

use std::time::Duration;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::{limits_or_default, resize_target, Encoded, PyLimits};
use crate::agent::ReadError;
use crate::background::{DoneSignal, Taken, Ticket};
use crate::cuda::{read_to_device, Destination, DestinationCell};
use crate::decode::{DecodeOptions, Mode};
use crate::errors::Error;
use crate::fair::FairPool;
use crate::publisher::{BatchControl, BatchImage, Published, Publisher, PublisherConfig};
use crate::wire::{notification_for, SlotHeader};
use std::sync::Arc;

use pyo3::ffi;

use crate::reader::{Lease, Pixels, Reader, ReaderConfig, Source};

/// A failed READ as a Python exception whose `may_land` attribute says
/// whether bytes may still arrive in the destination.
fn read_error(py: Python<'_>, e: ReadError) -> PyErr {
    let err = PyErr::from(e.error);
    // Setting an attribute on a fresh exception instance cannot fail.
    let _ = err.value(py).setattr("may_land", e.may_land);
    err
}

/// Makes NIXL's C API loadable from the installed wheel's copy.
#[pyfunction]
fn load_nixl(path: &str) -> PyResult<()> {
    Ok(crate::agent::load_library(path)?)
}

fn seconds(value: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        Error::InvalidArgument(format!("{what} must be a non-negative number of seconds")).into()
    })
}

#[pyclass(module = "pixelwire._native", frozen)]
pub struct NativePublisher {
    inner: Publisher,
    limits: crate::decode::Limits,
}

impl NativePublisher {
    /// The decode options of a publish: the publisher's limits, and the
    /// EXIF orientation applied, as vLLM (0.32) applies it to every image.
    fn decode_options(&self, mode: &str, background: (u8, u8, u8)) -> PyResult<DecodeOptions> {
        Ok(DecodeOptions {
            mode: Mode::parse(mode)?,
            background: [background.0, background.1, background.2],
            limits: self.limits,
            apply_exif_orientation: true,
        })
    }

    /// `to_python()`, the Python objects that describe `published`; should
    /// building them fail, the slots are freed rather than left published
    /// with nobody holding their descriptors.
    fn owned_by_python<T>(
        &self,
        published: &[&Published],
        to_python: impl FnOnce() -> PyResult<T>,
    ) -> PyResult<T> {
        to_python().inspect_err(|_| {
            for p in published {
                self.inner.release(p.slot, p.generation);
            }
        })
    }
}

/// What `NativePublisher.publish` returns for one image.
fn published_fields<'py>(py: Python<'py>, p: &Published) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("addr", p.addr)?;
    d.set_item("size", p.len)?;
    d.set_item("shape", (p.shape.height, p.shape.width, p.shape.channels))?;
    d.set_item(
        "source_shape",
        (p.source_shape.height, p.source_shape.width),
    )?;
    d.set_item("format", p.info.format.name())?;
    d.set_item("color_type", p.info.color_type)?;
    d.set_item("content_hash", &p.content_hash)?;
    d.set_item("slot", p.slot)?;
    d.set_item("generation", p.generation)?;
    d.set_item("expires_at", p.expires_at)?;
    d.set_item("notification", notification_for(p.slot, p.generation))?;
    d.set_item("metadata", &p.metadata)?;
    d.set_item("metadata_version", p.metadata_version)?;
    Ok(d)
}

#[pymethods]
impl NativePublisher {
    #[new]
    #[pyo3(signature = (*, pool_bytes, region_bytes, lease_seconds, acquire_timeout, limits = None))]
    fn new(
        py: Python<'_>,
        pool_bytes: usize,
        region_bytes: usize,
        lease_seconds: f64,
        acquire_timeout: f64,
        limits: Option<PyRef<'_, PyLimits>>,
    ) -> PyResult<Self> {
        let config = PublisherConfig {
            pool_bytes,
            region_bytes: region_bytes.max(1),
            lease: seconds(lease_seconds, "lease_seconds")?,
            acquire_timeout: seconds(acquire_timeout, "acquire_timeout")?,
        };
        let inner = py.detach(|| Publisher::new(config))?;
        Ok(NativePublisher {
            inner,
            limits: limits_or_default(limits.as_deref()),
        })
    }

    #[getter]
    fn agent_name(&self) -> String {
        self.inner.agent_name().to_string()
    }

    #[getter]
    fn metadata(&self) -> String {
        self.inner.metadata()
    }

    /// Decodes into a registered slot (resized to `resize=(height, width)`
    /// if given); returns the descriptor fields.
    #[pyo3(signature = (data, *, mode = "RGB", background = (255, 255, 255), rgbx = false, resize = None, resize_kernel = "torchvision", resize_filter = "bicubic"))]
    #[allow(clippy::too_many_arguments)]
    fn publish<'py>(
        &self,
        py: Python<'py>,
        data: Encoded<'py>,
        mode: &str,
        background: (u8, u8, u8),
        rgbx: bool,
        resize: Option<(usize, usize)>,
        resize_kernel: &str,
        resize_filter: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let target = resize_target(resize, resize_kernel, resize_filter)?;
        let opts = self.decode_options(mode, background)?;
        let bytes = data.as_slice();
        let published = py.detach(|| self.inner.publish(bytes, &opts, rgbx, target.as_ref()))?;
        self.owned_by_python(&[&published], || published_fields(py, &published))
    }

    /// Publishes every image of `inputs` as `publish` would, image `i`
    /// resized to `resizes[i]` when that is not None, decoding them on a pool
    /// of `threads` native threads (all cores by default) with the GIL
    /// released. One item per input, in order: its descriptor fields, or the
    /// exception that image failed with (returned, not raised: the others
    /// are published all the same).
    #[pyo3(signature = (inputs, *, mode = "RGB", background = (255, 255, 255), rgbx = false, resizes = None, resize_kernel = "torchvision", resize_filter = "bicubic", threads = None, control = None))]
    #[allow(clippy::too_many_arguments)]
    fn publish_many<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Encoded<'py>>,
        mode: &str,
        background: (u8, u8, u8),
        rgbx: bool,
        resizes: Option<Vec<Option<(usize, usize)>>>,
        resize_kernel: &str,
        resize_filter: &str,
        threads: Option<usize>,
        control: Option<&NativeBatchControl>,
    ) -> PyResult<Bound<'py, PyList>> {
        let opts = self.decode_options(mode, background)?;
        let resizes = resizes.unwrap_or_else(|| vec![None; inputs.len()]);
        if resizes.len() != inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "resizes has {} entries for {} inputs (one each, None for no resize)",
                resizes.len(),
                inputs.len()
            ))
            .into());
        }
        let images = inputs
            .iter()
            .zip(resizes)
            .map(|(data, size)| {
                Ok(BatchImage {
                    data: data.as_slice(),
                    resize: resize_target(size, resize_kernel, resize_filter)?,
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let pool = FairPool::shared(threads)?;
        let uncontrolled = BatchControl::default();
        let control = control.map_or(&uncontrolled, |c| &*c.inner);
        let outcomes = py.detach(|| {
            self.inner
                .publish_many(&pool, &images, &opts, rgbx, control)
        })?;
        let published: Vec<&Published> = outcomes.iter().flatten().collect();
        self.owned_by_python(&published, || {
            let items = outcomes
                .iter()
                .map(|outcome| match outcome {
                    Ok(p) => Ok(published_fields(py, p)?.into_any()),
                    Err(e) => Ok(PyErr::from(e.clone())
                        .into_value(py)
                        .into_bound(py)
                        .into_any()),
                })
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)
        })
    }

    fn release(&self, slot: u64, generation: u64) -> bool {
        self.inner.release(slot, generation)
    }

    /// Gives up the batch `control` was passed to: frees what it published
    /// and stops the rest; the number of slots freed.
    fn cancel(&self, control: &NativeBatchControl) -> usize {
        self.inner.cancel(&control.inner)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (slots, bytes, registered, regions) = self.inner.usage();
        let c = self.inner.counters();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let d = PyDict::new(py);
        d.set_item("slots_in_use", slots)?;
        d.set_item("bytes_in_use", bytes)?;
        d.set_item("registered_bytes", registered)?;
        d.set_item("regions", regions)?;
        d.set_item("published", load(&c.published))?;
        d.set_item("freed_by_notification", load(&c.freed_by_notification))?;
        d.set_item("reclaimed_by_lease", load(&c.reclaimed_by_lease))?;
        d.set_item("returned", load(&c.returned))?;
        d.set_item("stale_notifications", load(&c.stale_notifications))?;
        Ok(d)
    }

    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }
}

/// A handle on a running `publish_many` batch, for `NativePublisher.cancel`.
#[pyclass(module = "pixelwire._native", frozen, name = "BatchControl")]
pub struct NativeBatchControl {
    inner: Arc<BatchControl>,
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
}

#[pyclass(module = "pixelwire._native", frozen)]
pub struct NativeReader {
    inner: Arc<Reader>,
}

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

fn pixels_for_python(py: Python<'_>, pixels: Pixels) -> PyResult<Bound<'_, PyAny>> {
    match pixels {
        Pixels::Owned(pixels) => Ok(PyArray1::from_vec(py, pixels).into_any()),
        Pixels::Leased(lease) => Ok(Bound::new(py, PixelBuffer { lease })?.into_any()),
    }
}

/// A read started by `NativeReader.start_read`; its result is taken once.
#[pyclass(module = "pixelwire._native", frozen)]
pub struct ReadTicket {
    inner: Ticket<crate::errors::Result<Pixels>>,
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
    inner: Ticket<Result<(), ReadError>>,
    destination: Arc<DestinationCell>,
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
            Some(outcome) => outcome.map(|()| Some(true)).map_err(|e| read_error(py, e)),
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
    inner: Arc<DoneSignal>,
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

fn raise(signal: Option<Arc<DoneSignal>>) {
    if let Some(signal) = signal {
        signal.raise();
    }
}

fn mem_type(name: &str) -> PyResult<nixl_sys::MemType> {
    match name {
        "Dram" => Ok(nixl_sys::MemType::Dram),
        "Vram" => Ok(nixl_sys::MemType::Vram),
        other => Err(Error::Descriptor(format!(
            "unsupported mem_type {other:?} (expected 'Dram' or 'Vram')"
        ))
        .into()),
    }
}

#[pymethods]
impl NativeReader {
    #[new]
    #[pyo3(signature = (*, pool_bytes, region_bytes, timeout, verify, progress_thread = true, read_threads = 0, split_min_bytes = 0, chunk_bytes = usize::MAX, hash_threads = 4))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        pool_bytes: usize,
        region_bytes: usize,
        timeout: f64,
        verify: bool,
        progress_thread: bool,
        read_threads: usize,
        split_min_bytes: usize,
        chunk_bytes: usize,
        hash_threads: usize,
    ) -> PyResult<Self> {
        let config = ReaderConfig {
            pool_bytes,
            region_bytes: region_bytes.max(1),
            timeout: seconds(timeout, "timeout")?,
            verify,
            progress_thread,
            read_threads,
            split_min_bytes,
            chunk_bytes,
            hash_threads,
        };
        Ok(NativeReader {
            inner: Arc::new(py.detach(|| Reader::new(config))?),
        })
    }

    #[getter]
    fn agent_name(&self) -> String {
        self.inner.agent_name().to_string()
    }

    #[getter]
    fn remote_count(&self) -> usize {
        self.inner.remote_count()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (bytes_in_use, registered) = self.inner.usage();
        let d = PyDict::new(py);
        d.set_item("bytes_in_use", bytes_in_use)?;
        d.set_item("registered_bytes", registered)?;
        d.set_item("remotes", self.inner.remote_count())?;
        d.set_item("registered_caller_buffers", self.inner.foreign_count())?;
        Ok(d)
    }

    /// READs into host memory; returns a 1-D uint8 array owning the pixels,
    /// or a PixelBuffer over the receive slot (zero-copy) for numpy.frombuffer.
    /// `image` is the parsed descriptor (`pixelwire.descriptor.RemoteImage`).
    fn read<'py>(&self, py: Python<'py>, image: RemoteImage) -> PyResult<Bound<'py, PyAny>> {
        let source = image.into_source();
        let pixels = py.detach(|| self.inner.read(&source))?;
        pixels_for_python(py, pixels)
    }

    /// Starts `read(image)` on a native background thread and returns its
    /// ticket at once (nothing blocks here).
    /// With `signal`, the signal is raised once the read has finished.
    #[pyo3(signature = (image, signal = None))]
    fn start_read(&self, image: RemoteImage, signal: Option<PyRef<'_, ReadSignal>>) -> ReadTicket {
        let signal = signal.map(|s| Arc::clone(&s.inner));
        ReadTicket {
            inner: self
                .inner
                .read_soon(image.into_source(), move || raise(signal)),
        }
    }

    /// Registers caller memory (e.g. a CUDA staging buffer) for `read_into`;
    /// returns its id for `deregister`. The caller keeps it allocated until
    /// then (or for the reader's life).
    #[pyo3(signature = (*, addr, size, mem_type, device))]
    fn register(&self, addr: usize, size: usize, mem_type: &str, device: u64) -> PyResult<u64> {
        let kind = self::mem_type(mem_type)?;
        // SAFETY: documented contract: the Python layer keeps the buffer alive
        // until it deregisters it, or as long as the reader.
        Ok(unsafe { self.inner.register_foreign(addr, size, kind, device) }?)
    }

    /// Deregisters memory `register` returned `id` for; false if unknown.
    fn deregister(&self, py: Python<'_>, id: u64) -> bool {
        py.detach(|| self.inner.deregister_foreign(id))
    }

    /// READs straight into registered caller memory, then checks the slot
    /// header, and into host memory the content hash when the reader
    /// verifies (in chunks of whole hash pieces). With `chunk_bytes`,
    /// the READ goes in chunks of that size and `on_chunk(offset, length)` is
    /// called as each lands (before the check: only a normal return says the
    /// bytes are the published ones). A failure's exception has `may_land`:
    /// whether the transfer may still write the destination.
    #[pyo3(signature = (image, *, local_addr, mem_type, device, chunk_bytes = None, on_chunk = None))]
    #[allow(clippy::too_many_arguments)] // keyword options of the Python API
    fn read_into(
        &self,
        py: Python<'_>,
        image: RemoteImage,
        local_addr: usize,
        mem_type: &str,
        device: u64,
        chunk_bytes: Option<usize>,
        on_chunk: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let kind = self::mem_type(mem_type)?;
        let chunk = chunk_bytes.unwrap_or(image.size).max(1);
        let on_chunk = on_chunk.map(Bound::unbind);
        let source = image.into_source();
        // A callback's exception is kept to be raised as it is.
        let mut raised: Option<PyErr> = None;
        let mut call = |offset: usize, length: usize| -> crate::errors::Result<()> {
            let Some(callback) = &on_chunk else {
                return Ok(());
            };
            Python::attach(|py| callback.call1(py, (offset, length)).map(drop)).map_err(|e| {
                raised = Some(e);
                Error::Transfer("the on_chunk callback raised".into())
            })
        };
        let outcome = py.detach(|| {
            self.inner
                .read_into(&source, (local_addr, kind, device), chunk, &mut call)
        });
        match (outcome, raised) {
            (Err(_), Some(error)) => Err(error),
            (outcome, _) => outcome.map_err(|e| read_error(py, e)),
        }
    }

    /// Starts, on a native background thread, a READ into registered
    /// pinned host memory at `staging_addr` (room for the image) in chunks
    /// of `chunk_bytes`, each chunk copied on to CUDA device `device` on
    /// `stream` (a `cudaStream_t` handle of that device) as it lands, into
    /// the device memory the ticket is given with `copy_into` meanwhile;
    /// the slot header and, when the reader verifies, the content hash are
    /// checked. The ticket is done once the READ is checked and every copy
    /// queued (with `signal`, the signal is raised then): on success the
    /// device bytes are the image in `stream`'s order (and `ready_on`'s);
    /// on an error the copies have ended. Copies queued on `stream` by an
    /// earlier read, which read the staging memory, are waited for before
    /// the READ writes it. The caller keeps both buffers until `stream` has
    /// run the copies (and the staging memory registered, and unused, for
    /// as long as a failure's `may_land` says the READ may still land).
    #[pyo3(signature = (image, *, staging_addr, device, stream, chunk_bytes, signal = None))]
    fn start_read_to_cuda(
        &self,
        image: RemoteImage,
        staging_addr: usize,
        device: u32,
        stream: usize,
        chunk_bytes: usize,
        signal: Option<PyRef<'_, ReadSignal>>,
    ) -> DeviceReadTicket {
        let source = image.into_source();
        let destination = Arc::new(DestinationCell::default());
        let given = Arc::clone(&destination);
        let signal = signal.map(|s| Arc::clone(&s.inner));
        let inner = self.inner.soon(
            move |reader| {
                // SAFETY: the documented contract of this method: the
                // caller keeps both buffers until the ticket is done.
                unsafe {
                    read_to_device(
                        reader,
                        &source,
                        staging_addr,
                        (device, stream),
                        &given,
                        chunk_bytes,
                    )
                }
            },
            move || raise(signal),
        );
        DeviceReadTicket { inner, destination }
    }
}

/// What the native reader needs of a parsed descriptor, read from the
/// attributes of `pixelwire.descriptor.RemoteImage` (Python owns the
/// descriptor's schema and checks; this side only reads the result).
#[derive(FromPyObject)]
struct RemoteImage {
    agent: String,
    metadata: String,
    addr: usize,
    size: usize,
    notification: String,
    content_hash: Option<String>,
    metadata_version: Option<u64>,
    slot: Option<u64>,
    generation: Option<u64>,
}

impl RemoteImage {
    fn into_source(self) -> Source {
        Source {
            header: header(self.slot, self.generation, self.size),
            agent: self.agent,
            metadata: self.metadata,
            metadata_version: self.metadata_version,
            addr: self.addr,
            len: self.size,
            content_hash: self.content_hash,
            notification: self.notification,
        }
    }
}

fn header(slot: Option<u64>, generation: Option<u64>, len: usize) -> Option<SlotHeader> {
    Some(SlotHeader {
        slot: slot?,
        generation: generation?,
        len: len as u64,
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add(
        "MIN_LEASE_SECONDS",
        crate::publisher::MIN_LEASE.as_secs_f64(),
    )?;
    m.add_function(wrap_pyfunction!(load_nixl, m)?)?;
    m.add_class::<NativePublisher>()?;
    m.add_class::<NativeBatchControl>()?;
    m.add_class::<NativeReader>()?;
    m.add_class::<PixelBuffer>()?;
    m.add_class::<ReadTicket>()?;
    m.add_class::<ReadSignal>()?;
    m.add_class::<DeviceReadTicket>()?;
    Ok(())
}
