//! Thin PyO3 wrappers over the plain-Rust core. Every heavy call runs with
//! the GIL released.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

mod batch;
mod errors;
mod patches;
mod pixels;
mod publisher;
mod reader;
mod tickets;
mod video;

use crate::decode::{self, DecodeOptions, Mode, OutputShape};
use crate::errors::Error;
use crate::identify;

/// Decoding limits, checked from the header before pixel memory is taken.
#[pyclass(module = "pixelwire", name = "Limits", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyLimits {
    pub inner: decode::Limits,
}

#[pymethods]
impl PyLimits {
    #[new]
    #[pyo3(signature = (*, max_bytes = None, max_pixels = None, max_side = None))]
    fn new(max_bytes: Option<usize>, max_pixels: Option<u64>, max_side: Option<u32>) -> Self {
        let d = decode::Limits::default();
        PyLimits {
            inner: decode::Limits {
                max_bytes: max_bytes.unwrap_or(d.max_bytes),
                max_pixels: max_pixels.unwrap_or(d.max_pixels),
                max_side: max_side.unwrap_or(d.max_side),
            },
        }
    }

    #[getter]
    fn max_bytes(&self) -> usize {
        self.inner.max_bytes
    }

    #[getter]
    fn max_pixels(&self) -> u64 {
        self.inner.max_pixels
    }

    #[getter]
    fn max_side(&self) -> u32 {
        self.inner.max_side
    }

    fn __repr__(&self) -> String {
        format!(
            "Limits(max_bytes={}, max_pixels={}, max_side={})",
            self.inner.max_bytes, self.inner.max_pixels, self.inner.max_side
        )
    }
}

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

pub fn limits_or_default(limits: Option<&PyLimits>) -> decode::Limits {
    limits.map(|l| l.inner).unwrap_or_default()
}

/// The decode options of `decode_image`, `decode_many` and a publish,
/// checked.
pub fn decode_options(
    mode: &str,
    background: (u8, u8, u8),
    limits: decode::Limits,
    apply_exif_orientation: bool,
) -> PyResult<DecodeOptions> {
    Ok(DecodeOptions {
        mode: Mode::parse(mode)?,
        background: [background.0, background.1, background.2],
        limits,
        apply_exif_orientation,
    })
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

/// `resize=`: one (height, width), or a chain of sizes resized to in turn
/// (for processors that resize twice in a row).
#[derive(Clone, FromPyObject)]
pub enum ResizeArg {
    Size((usize, usize)),
    Chain(Vec<(usize, usize)>),
}

/// `resize=` with its kernel and filter names, checked.
pub fn resize_target(
    size: Option<ResizeArg>,
    kernel: &str,
    filter: &str,
) -> PyResult<Option<crate::resize::Target>> {
    let invalid = |e: String| PyErr::from(crate::errors::Error::InvalidArgument(e));
    let spec = crate::resize::ResizeSpec {
        kernel: crate::resize::Kernel::parse(kernel)?,
        filter: crate::resize::Filter::parse(filter)?,
    };
    let (via, (height, width)) = match size {
        None => return Ok(None),
        Some(ResizeArg::Size(size)) => (None, size),
        Some(ResizeArg::Chain(sizes)) => match sizes[..] {
            [size] => (None, size),
            [via, size] => (Some(via), size),
            _ => {
                return Err(invalid(format!(
                    "a resize chain has one or two sizes, not {}",
                    sizes.len()
                )))
            }
        },
    };
    if let Some((h, w)) = via
        .into_iter()
        .chain([(height, width)])
        .find(|&(h, w)| h == 0 || w == 0)
    {
        return Err(invalid(format!(
            "resize size must be positive, not {h}x{w}"
        )));
    }
    Ok(Some(crate::resize::Target {
        height,
        width,
        spec,
        via,
    }))
}

/// Decodes an image to a C-contiguous `uint8` array of shape (H, W, C);
/// with `resize=(height, width)`, resized to that size right after
/// decoding with the named processor arithmetic.
#[pyfunction]
#[pyo3(signature = (data, *, mode = "RGB", background = (255, 255, 255), limits = None, apply_exif_orientation = true, resize = None, resize_kernel = "torchvision", resize_filter = "bicubic", patches = None, normalize = None))]
#[allow(clippy::too_many_arguments)]
fn decode_image<'py>(
    py: Python<'py>,
    data: Encoded<'py>,
    mode: &str,
    background: (u8, u8, u8),
    limits: Option<PyRef<'py, PyLimits>>,
    apply_exif_orientation: bool,
    resize: Option<ResizeArg>,
    resize_kernel: &str,
    resize_filter: &str,
    patches: Option<(usize, usize, usize)>,
    normalize: Option<patches::NormalizeArg>,
) -> PyResult<Bound<'py, PyAny>> {
    let opts = decode_options(
        mode,
        background,
        limits_or_default(limits.as_deref()),
        apply_exif_orientation,
    )?;
    let target = resize_target(resize, resize_kernel, resize_filter)?;
    let grid = patches::grid_arg(patches, normalize)?;
    let floats = grid.is_some_and(|g| g.value_bytes() == 4);
    if grid.is_some() && opts.mode != Mode::Rgb {
        return Err(Error::InvalidArgument("patch rows need mode RGB".into()).into());
    }
    let bytes = data.as_slice();
    let (shape, pixels) = py.detach(|| {
        let info = decode::probe(bytes, &opts.limits)?;
        let shape = decode::resized_shape(info.output_shape(&opts), target.as_ref());
        let out = decode::decode_resized(bytes, &info, &opts, target.as_ref())?;
        let Some(grid) = grid else {
            return Ok::<_, Error>((shape, out));
        };
        // The processor's patch rows of the decoded image (`crate::patches`).
        let (rows, row_len) = grid.shape(shape.height, shape.width)?;
        let mut laid_out = vec![0u8; grid.bytes(shape.height, shape.width)?];
        grid.write(&out, shape.height, shape.width, &mut laid_out)?;
        decode::recycle::give_back(out);
        let shape = OutputShape {
            height: rows,
            width: row_len,
            channels: grid.value_bytes(),
        };
        Ok((shape, laid_out))
    })?;
    let array = pixels::array(py, pixels, shape)?;
    if !floats {
        return Ok(array);
    }
    // Float rows: the bytes seen as native-endian float32, (rows, row length, 1).
    array.call_method1("view", ("float32",))
}

/// Reads the header only: format, stored size, source mode, EXIF
/// orientation, and the (height, width) once oriented.
#[pyfunction]
#[pyo3(signature = (data, *, limits = None))]
fn probe_image<'py>(
    py: Python<'py>,
    data: Encoded<'py>,
    limits: Option<PyRef<'py, PyLimits>>,
) -> PyResult<Bound<'py, PyDict>> {
    let limits = limits_or_default(limits.as_deref());
    let bytes = data.as_slice();
    let info = py.detach(|| decode::probe(bytes, &limits))?;
    let d = PyDict::new(py);
    d.set_item("format", info.format.name())?;
    d.set_item("width", info.width)?;
    d.set_item("height", info.height)?;
    d.set_item("color_type", info.color_type)?;
    d.set_item("orientation", info.orientation)?;
    // What decode_image gives by default (the orientation applied).
    let shown = info.output_shape(&DecodeOptions {
        apply_exif_orientation: true,
        ..DecodeOptions::default()
    });
    d.set_item("oriented_size", (shown.height, shown.width))?;
    Ok(d)
}

/// Decodes an RFC 2397 base64 `data:` URL: returns (media type, bytes).
#[pyfunction]
fn decode_data_url<'py>(py: Python<'py>, url: &str) -> PyResult<(String, Bound<'py, PyBytes>)> {
    let parsed = py.detach(|| crate::wire::parse_data_url(url))?;
    Ok((parsed.media_type, PyBytes::new(py, &parsed.bytes)))
}

/// A request body's large `data:` URL string values cut out
/// (`json_body::scan`): (skeleton or None, bound on its JSON values, each
/// cut string's contents as a (start, end) byte range of `raw`).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn scan_json_body<'py>(
    py: Python<'py>,
    raw: &[u8],
    min_len: usize,
    prefix: &str,
) -> (Option<Bound<'py, PyBytes>>, usize, Vec<(usize, usize)>) {
    let scanned = py.detach(|| crate::json_body::scan(raw, min_len, prefix));
    let skeleton = scanned.skeleton.map(|s| PyBytes::new(py, &s));
    (skeleton, scanned.values, scanned.cut)
}

/// The descriptors' `content_hash` of a buffer (`wire::content_hash`).
#[pyfunction]
fn content_hash(py: Python<'_>, data: Encoded<'_>) -> String {
    let bytes = data.as_slice();
    py.detach(|| crate::wire::content_hash(bytes))
}

/// Whether `text` has the form of a `content_hash`.
#[pyfunction]
fn is_content_hash(text: &str) -> bool {
    crate::wire::is_content_hash(text)
}

/// The container `data` is, identified from its own bytes before it goes
/// to another party's loader of `medium` (`identify::identify`).
#[pyfunction]
fn identify_container(py: Python<'_>, data: Encoded<'_>, medium: &str) -> PyResult<&'static str> {
    let medium = match medium {
        "video" => identify::Medium::Video,
        "audio" => identify::Medium::Audio,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "medium must be 'video' or 'audio', not {other:?}"
            )))
        }
    };
    let bytes = data.as_slice();
    Ok(py.detach(|| identify::identify(bytes, medium))?.name())
}

/// Makes NIXL's C API loadable from the installed wheel's copy.
#[pyfunction]
fn load_nixl(path: &str) -> PyResult<()> {
    Ok(crate::agent::load_library(path)?)
}

/// The notification that ends a hand-out of a published slot
/// (`pw1:<slot>:<generation>`, `:<handout>` after it for a hand-out other
/// than the first): the frontend mints it, a reader sends it back after its
/// READ.
#[pyfunction]
#[pyo3(signature = (slot, generation, handout = 0))]
fn notification_for(slot: u64, generation: u64, handout: u64) -> String {
    crate::wire::notification_for(slot, generation, handout)
}

/// (slot, generation, hand-out) a notification names, if it is one in its
/// one written form.
#[pyfunction]
fn parse_notification(text: &str) -> Option<(u64, u64, u64)> {
    crate::wire::parse_notification(text.as_bytes())
        .filter(|&(s, g, h)| crate::wire::notification_for(s, g, h) == text)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_function(wrap_pyfunction!(load_nixl, m)?)?;
    m.add_function(wrap_pyfunction!(identify_container, m)?)?;
    publisher::register(m)?;
    reader::register(m)?;
    tickets::register(m)?;
    video::register(m)?;
    m.add_function(wrap_pyfunction!(decode_data_url, m)?)?;
    m.add_function(wrap_pyfunction!(scan_json_body, m)?)?;
    m.add_function(wrap_pyfunction!(content_hash, m)?)?;
    m.add_function(wrap_pyfunction!(is_content_hash, m)?)?;
    m.add_function(wrap_pyfunction!(notification_for, m)?)?;
    m.add_function(wrap_pyfunction!(parse_notification, m)?)?;
    m.add_class::<PyLimits>()?;
    m.add_function(wrap_pyfunction!(decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(batch::decode_many, m)?)?;
    m.add_function(wrap_pyfunction!(patches::join_patch_rows, m)?)?;
    m.add_function(wrap_pyfunction!(probe_image, m)?)?;
    Ok(())
}
