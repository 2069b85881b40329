//! The decode bindings: `Limits`, `decode_image`, `decode_many`,
//! `probe_image` and `identify_container`, and the one place their keyword
//! arguments become decode options and a resize target
//! (`decode_options`, `resize_target`), which the publish and video
//! bindings build theirs with too.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::args::Encoded;
use super::pixels;
use crate::decode::{self, DecodeOptions, Mode, OutputShape};
use crate::errors::Error;
use crate::identify;
use crate::resize::Target;

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
) -> PyResult<Option<Target>> {
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
    Ok(Some(Target {
        height,
        width,
        spec,
        via,
    }))
}

/// The options `decode_image` and `decode_many` decode with: their keyword
/// arguments, checked.
fn image_options(
    mode: &str,
    background: (u8, u8, u8),
    limits: Option<&PyLimits>,
    apply_exif_orientation: bool,
    resize: Option<ResizeArg>,
    resize_kernel: &str,
    resize_filter: &str,
) -> PyResult<(DecodeOptions, Option<Target>)> {
    let opts = decode_options(
        mode,
        background,
        limits_or_default(limits),
        apply_exif_orientation,
    )?;
    let target = resize_target(resize, resize_kernel, resize_filter)?;
    Ok((opts, target))
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
    normalize: Option<super::patches::NormalizeArg>,
) -> PyResult<Bound<'py, PyAny>> {
    let (opts, target) = image_options(
        mode,
        background,
        limits.as_deref(),
        apply_exif_orientation,
        resize,
        resize_kernel,
        resize_filter,
    )?;
    let grid = super::patches::grid_arg(patches, normalize)?;
    let floats = grid.is_some_and(|g| g.value_bytes() == 4);
    if grid.is_some() {
        crate::patches::check_mode(opts.mode)?;
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

/// Decodes every image of `inputs` with `decode_image`'s options on a pool
/// of `threads` native threads (all cores by default), each taking the
/// next image, largest encoded input first (one image: on this thread),
/// with the GIL released; the arrays come back in input order. The first input that
/// fails raises its error with `index` set to its position.
#[pyfunction]
#[pyo3(signature = (inputs, *, mode = "RGB", background = (255, 255, 255), limits = None, apply_exif_orientation = true, resize = None, resize_kernel = "torchvision", resize_filter = "bicubic", threads = None))]
#[allow(clippy::too_many_arguments)]
fn decode_many<'py>(
    py: Python<'py>,
    inputs: Vec<Encoded<'py>>,
    mode: &str,
    background: (u8, u8, u8),
    limits: Option<PyRef<'py, PyLimits>>,
    apply_exif_orientation: bool,
    resize: Option<ResizeArg>,
    resize_kernel: &str,
    resize_filter: &str,
    threads: Option<usize>,
) -> PyResult<Bound<'py, PyList>> {
    let (opts, target) = image_options(
        mode,
        background,
        limits.as_deref(),
        apply_exif_orientation,
        resize,
        resize_kernel,
        resize_filter,
    )?;
    let pool = decode::thread_pool(threads)?;
    let slices: Vec<&[u8]> = inputs.iter().map(Encoded::as_slice).collect();
    let images = py.detach(|| decode::decode_many(&pool, &slices, &opts, target.as_ref()))?;
    let arrays = images
        .into_iter()
        .map(|(shape, pixels)| pixels::array(py, pixels, shape))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, arrays)
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

/// The container (or, for an image, the format as Pillow names it) `data`
/// is, identified from its own bytes before it goes to another party's
/// loader of `medium` (`identify::identify`).
#[pyfunction]
fn identify_container(py: Python<'_>, data: Encoded<'_>, medium: &str) -> PyResult<&'static str> {
    let medium = match medium {
        "video" => identify::Medium::Video,
        "audio" => identify::Medium::Audio,
        "image" => identify::Medium::Image,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "medium must be 'video', 'audio' or 'image', not {other:?}"
            )))
        }
    };
    let bytes = data.as_slice();
    Ok(py.detach(|| identify::identify(bytes, medium))?.name())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(identify_container, m)?)?;
    m.add_class::<PyLimits>()?;
    m.add_function(wrap_pyfunction!(decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(decode_many, m)?)?;
    m.add_function(wrap_pyfunction!(probe_image, m)?)?;
    Ok(())
}
