//! `decode_many`: a list of images decoded on a native thread pool.

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::{decode_options, limits_or_default, resize_target, Encoded, PyLimits, ResizeArg};
use crate::decode;

/// Decodes every image of `inputs` with `decode_image`'s options on a pool
/// of `threads` native threads (all cores by default) with the GIL
/// released; the arrays come back in input order. The first input that
/// fails raises its error with `index` set to its position.
#[pyfunction]
#[pyo3(signature = (inputs, *, mode = "RGB", background = (255, 255, 255), limits = None, apply_exif_orientation = true, resize = None, resize_kernel = "torchvision", resize_filter = "bicubic", threads = None))]
#[allow(clippy::too_many_arguments)]
pub fn decode_many<'py>(
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
    let opts = decode_options(
        mode,
        background,
        limits_or_default(limits.as_deref()),
        apply_exif_orientation,
    )?;
    let target = resize_target(resize, resize_kernel, resize_filter)?;
    let pool = decode::thread_pool(threads)?;
    let slices: Vec<&[u8]> = inputs.iter().map(Encoded::as_slice).collect();
    let images = py.detach(|| decode::decode_many(&pool, &slices, &opts, target.as_ref()))?;
    let arrays = images
        .into_iter()
        .map(|(shape, pixels)| super::pixels::array(py, pixels, shape))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, arrays)
}
