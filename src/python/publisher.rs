//! PyO3 wrappers for the frontend side of the transfer: `NativePublisher`
//! decodes into registered slots (GIL released; the Python layer calls it
//! from worker threads so the event loop never blocks) and
//! `BatchControl` cancels a running batch.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::args::{seconds, Encoded};
use super::decode::{decode_options, limits_or_default, resize_target, PyLimits, ResizeArg};
use crate::decode::DecodeOptions;
use crate::errors::Error;
use crate::fair::FairPool;
use crate::publisher::{
    BatchControl, BatchImage, Packing, Published, PublishedSlot, Publisher, PublisherConfig,
};
use crate::video;
use crate::wire::notification_for;

use super::control::NativeBatchControl;
use super::patches::{grid_arg, NormalizeArg};
use super::video::PyVideoCapture;

#[pyclass(module = "pixelwire._native", frozen)]
pub struct NativePublisher {
    inner: Publisher,
    limits: crate::decode::Limits,
}

impl NativePublisher {
    /// The decode options of a publish: the publisher's limits, and the
    /// EXIF orientation applied, as vLLM (0.32) applies it to every image.
    fn decode_options(&self, mode: &str, background: (u8, u8, u8)) -> PyResult<DecodeOptions> {
        decode_options(mode, background, self.limits, true)
    }

    /// `to_python()`, the Python objects that describe `published`; should
    /// building them fail, the slots are freed rather than left published
    /// with nobody holding their descriptors.
    fn owned_by_python<T>(
        &self,
        published: &[&PublishedSlot],
        to_python: impl FnOnce() -> PyResult<T>,
    ) -> PyResult<T> {
        to_python().inspect_err(|_| {
            for p in published {
                self.inner.release(p.slot, p.generation, p.handout);
            }
        })
    }
}

/// The layout a publish asks for: `rgbx` (Pillow's four bytes a pixel) or
/// `patches=(patch_size, temporal_patch_size, merge_size)` (a processor's
/// patch rows), not both.
fn packing(
    rgbx: bool,
    patches: Option<(usize, usize, usize)>,
    normalize: Option<NormalizeArg>,
) -> PyResult<Packing> {
    Ok(match (rgbx, grid_arg(patches, normalize)?) {
        (false, None) => Packing::Hwc,
        (true, None) => Packing::Rgbx,
        (false, Some(grid)) => Packing::Patches(grid),
        (true, Some(_)) => {
            return Err(
                Error::InvalidArgument("rgbx and patches are two layouts: pick one".into()).into(),
            )
        }
    })
}

/// The fields of a published slot, as every publish returns them.
fn slot_fields<'py>(py: Python<'py>, p: &PublishedSlot) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("addr", p.addr)?;
    d.set_item("size", p.len)?;
    d.set_item("content_hash", &p.content_hash)?;
    d.set_item("slot", p.slot)?;
    d.set_item("generation", p.generation)?;
    d.set_item("expires_at", p.expires_at)?;
    d.set_item("handout", p.handout)?;
    d.set_item(
        "notification",
        notification_for(p.slot, p.generation, p.handout),
    )?;
    d.set_item("metadata", &p.metadata)?;
    d.set_item("metadata_version", p.metadata_version)?;
    d.set_item("metadata_pruned", p.metadata_pruned)?;
    Ok(d)
}

/// What `NativePublisher.publish` returns for one image.
fn published_fields<'py>(py: Python<'py>, p: &Published) -> PyResult<Bound<'py, PyDict>> {
    let d = slot_fields(py, &p.slot)?;
    d.set_item("shape", (p.shape.height, p.shape.width, p.shape.channels))?;
    d.set_item(
        "source_shape",
        (p.source_shape.height, p.source_shape.width),
    )?;
    d.set_item("format", p.info.format.name())?;
    d.set_item("color_type", p.info.color_type)?;
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
    #[pyo3(signature = (data, *, mode = "RGB", background = (255, 255, 255), rgbx = false, patches = None, normalize = None, resize = None, resize_kernel = "torchvision", resize_filter = "bicubic"))]
    #[allow(clippy::too_many_arguments)]
    fn publish<'py>(
        &self,
        py: Python<'py>,
        data: Encoded<'py>,
        mode: &str,
        background: (u8, u8, u8),
        rgbx: bool,
        patches: Option<(usize, usize, usize)>,
        normalize: Option<NormalizeArg>,
        resize: Option<ResizeArg>,
        resize_kernel: &str,
        resize_filter: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let target = resize_target(resize, resize_kernel, resize_filter)?;
        let opts = self.decode_options(mode, background)?;
        let packing = packing(rgbx, patches, normalize)?;
        let bytes = data.as_slice();
        let published = py.detach(|| self.inner.publish(bytes, &opts, packing, target.as_ref()))?;
        self.owned_by_python(&[&published.slot], || published_fields(py, &published))
    }

    /// Publishes every image of `inputs` as `publish` would, image `i`
    /// resized to `resizes[i]` when that is not None, decoding them on a pool
    /// of `threads` native threads (all cores by default) with the GIL
    /// released. One item per input, in order: its descriptor fields, or the
    /// exception that image failed with (returned, not raised: the others
    /// are published all the same).
    #[pyo3(signature = (inputs, *, mode = "RGB", background = (255, 255, 255), rgbx = false, patches = None, normalize = None, resizes = None, resize_kernel = "torchvision", resize_filter = "bicubic", threads = None, control = None))]
    #[allow(clippy::too_many_arguments)]
    fn publish_many<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Encoded<'py>>,
        mode: &str,
        background: (u8, u8, u8),
        rgbx: bool,
        patches: Option<(usize, usize, usize)>,
        normalize: Option<NormalizeArg>,
        resizes: Option<Vec<Option<ResizeArg>>>,
        resize_kernel: &str,
        resize_filter: &str,
        threads: Option<usize>,
        control: Option<&NativeBatchControl>,
    ) -> PyResult<Bound<'py, PyList>> {
        let opts = self.decode_options(mode, background)?;
        let packing = packing(rgbx, patches, normalize)?;
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
                .publish_many(&pool, &images, &opts, packing, control)
        })?;
        let published: Vec<&PublishedSlot> = outcomes.iter().flatten().map(|p| &p.slot).collect();
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

    /// Decodes the frames `indices` of an opened capture (each once, in
    /// order; those that do not decode are left out), each resized to
    /// `resize` when given, straight into one slot and publishes it: the
    /// slot's fields plus `shape` (T, H, W, 3) and the `indices` decoded.
    /// The capture is read (and closed) by this call. `cancel(control)`
    /// stops the decoding and frees the slot (the call then raises
    /// `Cancelled`).
    #[pyo3(signature = (capture, indices, *, control = None, resize = None, resize_kernel = "torchvision", resize_filter = "bicubic"))]
    #[allow(clippy::too_many_arguments)]
    fn publish_video<'py>(
        &self,
        py: Python<'py>,
        mut capture: PyRefMut<'_, PyVideoCapture>,
        indices: Vec<usize>,
        control: Option<PyRef<'_, NativeBatchControl>>,
        resize: Option<ResizeArg>,
        resize_kernel: &str,
        resize_filter: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let target = resize_target(resize, resize_kernel, resize_filter)?;
        let mut capture = capture.take()?;
        let control =
            control.map_or_else(|| Arc::new(BatchControl::default()), |c| c.inner.clone());
        let published = py.detach(|| {
            video::publish_video(
                &self.inner,
                &mut capture,
                &indices,
                target.as_ref(),
                &control,
            )
        })?;
        self.owned_by_python(&[&published.slot], || {
            let d = slot_fields(py, &published.slot)?;
            let frames = published.indices.len();
            d.set_item("shape", (frames, published.height, published.width, 3))?;
            d.set_item("indices", &published.indices)?;
            Ok(d)
        })
    }

    /// Ends hand-out `handout` of a slot; true when that freed it.
    #[pyo3(signature = (slot, generation, handout = 0))]
    fn release(&self, slot: u64, generation: u64, handout: u64) -> bool {
        self.inner.release(slot, generation, handout)
    }

    /// Pins a published slot for a cache, within `budget` pinned bytes.
    fn pin(&self, slot: u64, generation: u64, budget: usize) -> bool {
        self.inner.pin(slot, generation, budget)
    }

    /// Takes a cache's pin off a slot; true when it was pinned.
    fn unpin(&self, slot: u64, generation: u64) -> bool {
        self.inner.unpin(slot, generation)
    }

    /// A new hand-out of a pinned slot: the fields its descriptor gets
    /// anew, or None when the slot is no longer pinned at `generation`.
    fn hand_out<'py>(
        &self,
        py: Python<'py>,
        slot: u64,
        generation: u64,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(h) = self.inner.hand_out(slot, generation) else {
            return Ok(None);
        };
        let fields = (|| {
            let d = PyDict::new(py);
            d.set_item("handout", h.handout)?;
            d.set_item(
                "notification",
                notification_for(slot, generation, h.handout),
            )?;
            d.set_item("expires_at", h.expires_at)?;
            d.set_item("metadata", &h.metadata)?;
            d.set_item("metadata_version", h.metadata_version)?;
            d.set_item("metadata_pruned", h.metadata_pruned)?;
            Ok(d)
        })();
        if fields.is_err() {
            self.inner.release(slot, generation, h.handout);
        }
        fields.map(Some)
    }

    /// (slot, generation) of every pin taken off since the last call.
    fn take_evicted(&self) -> Vec<(u64, u64)> {
        self.inner.take_evicted()
    }

    /// Gives up the batch `control` was passed to: frees what it published
    /// and stops the rest; the number of its hand-outs ended.
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
        let (pinned_slots, pinned_bytes, handouts) = self.inner.holds();
        d.set_item("pinned_slots", pinned_slots)?;
        d.set_item("pinned_bytes", pinned_bytes)?;
        d.set_item("outstanding_handouts", handouts)?;
        d.set_item("handed_out", load(&c.handed_out))?;
        d.set_item("evicted", load(&c.evicted))?;
        d.set_item("freed_by_eviction", load(&c.freed_by_eviction))?;
        Ok(d)
    }

    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add(
        "MIN_LEASE_SECONDS",
        crate::publisher::MIN_LEASE.as_secs_f64(),
    )?;
    m.add("SLOT_HEADER_BYTES", crate::wire::SLOT_HEADER_BYTES)?;
    m.add_class::<NativePublisher>()?;
    Ok(())
}
