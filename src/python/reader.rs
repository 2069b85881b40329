//! PyO3 wrappers for the worker side of the transfer: `NativeReader`
//! READs what a parsed descriptor names into its receive pool or into
//! registered caller memory. Blocking work (waiting for a slot, for a
//! READ) runs with the GIL released; reads started in the background hand
//! their results back through the tickets of `tickets.rs`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::args::seconds;
use super::tickets::{pixels_for_python, raise, DeviceReadTicket, ReadSignal, ReadTicket};
use crate::cuda::{read_to_device, DestinationCell};
use crate::errors::Error;
use crate::foreign::Owner;
use crate::reader::{Reader, ReaderConfig, Source};
use crate::region::ForeignRegion;
use crate::wire::SlotHeader;

#[pyclass(module = "pixelwire._native", frozen)]
pub struct NativeReader {
    inner: Arc<Reader>,
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
    fn new(py: Python<'_>, settings: ReaderSettings) -> PyResult<Self> {
        let config = settings.into_config()?;
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
        let (connects, merges) = self.inner.remote_load_counts();
        d.set_item("remote_connects", connects)?;
        d.set_item("remote_merges", merges)?;
        d.set_item("registered_caller_buffers", self.inner.foreign_count())?;
        let (slots, caller_buffers) = self.inner.quarantined();
        d.set_item("quarantined_slots", slots)?;
        d.set_item("quarantined_caller_buffers", caller_buffers)?;
        d.set_item("abandoned_reads", self.inner.abandoned_reads())?;
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
    /// returns its id for `deregister`. `owner` (the tensor the memory
    /// belongs to) is kept as long as the registration; without one the
    /// caller keeps the memory allocated for the reader's life.
    #[pyo3(signature = (*, addr, size, mem_type, device, owner = None))]
    fn register(
        &self,
        addr: usize,
        size: usize,
        mem_type: &str,
        device: u64,
        owner: Option<Py<PyAny>>,
    ) -> PyResult<u64> {
        let region = ForeignRegion {
            addr,
            len: size,
            mem_type: self::mem_type(mem_type)?,
            device,
        };
        let owner = owner.map(|o| Box::new(o) as Owner);
        // SAFETY: documented contract: `owner` keeps the memory, or the
        // caller does for the reader's life.
        Ok(unsafe { self.inner.register_foreign(region, owner) }?)
    }

    /// Gives up memory `register` returned `id` for: deregistered now, or,
    /// while a failed READ may still write it, once its quarantine ends
    /// (its owner is kept until then); false if unknown.
    fn deregister(&self, py: Python<'_>, id: u64) -> bool {
        py.detach(|| self.inner.deregister_foreign(id))
    }

    /// Whether a failed READ may still write registered memory `id`: no
    /// read goes into it until this is false (give it up and use other
    /// memory instead).
    fn quarantined(&self, id: u64) -> bool {
        self.inner.foreign_quarantined(id)
    }

    /// READs straight into registered caller memory, then checks the slot
    /// header, and into host memory the content hash when the reader
    /// verifies (in chunks of whole hash pieces). With `chunk_bytes`,
    /// the READ goes in chunks of that size and `on_chunk(offset, length)` is
    /// called as each lands (before the check: only a normal return says the
    /// bytes are the published ones). A failure's `TransferError` has
    /// `may_land`: whether the transfer may still write the destination;
    /// registered memory it may write is quarantined (`quarantined`).
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
            (outcome, _) => Ok(outcome?),
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
    /// run the copies; staging memory a failed READ may still write is
    /// quarantined (`quarantined`), and stays registered, its owner kept,
    /// until that is over.
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

/// What the native reader needs of `pixelwire.config.ReaderSettings`, read
/// from its attributes: Python owns the settings, their defaults and their
/// checks; this side only reads them.
#[derive(FromPyObject)]
struct ReaderSettings {
    pool_bytes: usize,
    region_bytes: usize,
    timeout: f64,
    frontend_idle: f64,
    verify: bool,
    progress_thread: bool,
    read_threads: usize,
    split_min_bytes: usize,
    chunk_bytes: usize,
    hash_threads: usize,
}

impl ReaderSettings {
    fn into_config(self) -> PyResult<ReaderConfig> {
        Ok(ReaderConfig {
            pool_bytes: self.pool_bytes,
            region_bytes: self.region_bytes,
            timeout: seconds(self.timeout, "timeout")?,
            frontend_idle: seconds(self.frontend_idle, "frontend_idle")?,
            verify: self.verify,
            progress_thread: self.progress_thread,
            read_threads: self.read_threads,
            split_min_bytes: self.split_min_bytes,
            chunk_bytes: self.chunk_bytes,
            hash_threads: self.hash_threads,
        })
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
    metadata_pruned: Option<u64>,
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
            metadata_pruned: self.metadata_pruned,
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
    m.add_class::<NativeReader>()?;
    Ok(())
}
