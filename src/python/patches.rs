//! PyO3 wrapper of `crate::patches` for the worker: a request's processed
//! images joined into the one tensor of patch rows vLLM's engine gets.

use numpy::{PyReadonlyArray2, PyReadonlyArray4, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::pixels;
use crate::decode::OutputShape;
use crate::errors::Error;
use crate::patches::{self, Backend, Normalise, PatchGrid, Values};

/// `normalize=(backend, image_mean, image_std, rescale_factor)`: the
/// processor's float rows (`backend`: "torchvision" or "pil").
pub type NormalizeArg = (String, (f64, f64, f64), (f64, f64, f64), f64);

/// The patch grid of `patches=(patch_size, temporal_patch_size,
/// merge_size)`, its rows `float32` normalised as `normalize` says (`u8`
/// without); `normalize` needs `patches`.
pub fn grid_arg(
    patches: Option<(usize, usize, usize)>,
    normalize: Option<NormalizeArg>,
) -> PyResult<Option<PatchGrid>> {
    let Some((patch, temporal, merge)) = patches else {
        if normalize.is_some() {
            return Err(
                Error::InvalidArgument("normalize= is for patch rows (patches=)".into()).into(),
            );
        }
        return Ok(None);
    };
    let grid = PatchGrid::new(patch, temporal, merge)?;
    let Some(normalize) = normalize else {
        return Ok(Some(grid));
    };
    Ok(Some(
        grid.with_values(Values::F32(normalise_arg(normalize)?)),
    ))
}

/// The processor's rescale and normalisation of `normalize=`.
fn normalise_arg(normalize: NormalizeArg) -> PyResult<Normalise> {
    let (backend, mean, std, rescale) = normalize;
    let backend = match backend.as_str() {
        "torchvision" => Backend::Torchvision,
        "pil" => Backend::Pil,
        other => {
            return Err(Error::InvalidArgument(format!(
                "normalize backend must be 'torchvision' or 'pil', not {other:?}"
            ))
            .into())
        }
    };
    Ok(Normalise::new(
        backend,
        [mean.0, mean.1, mean.2],
        [std.0, std.1, std.2],
        rescale,
    )?)
}

/// `parts` (2-D uint8 arrays of patch rows, C-contiguous) joined in order
/// into one new array (rows, row length, 1), part `i`'s every block
/// repeated `copies[i]` times (a processor's temporal copies of an image);
/// every part must land at one row length. With `normalize` (as for
/// `decode_image`), each byte lands as the processor's normalised float32
/// value: the array is then (rows, row length, 4), each value's four
/// native-endian bytes. The GIL is released while it copies; the output's
/// memory is recycled from earlier outputs.
#[pyfunction]
#[pyo3(signature = (parts, copies, normalize = None))]
pub fn join_patch_rows<'py>(
    py: Python<'py>,
    parts: Vec<PyReadonlyArray2<'py, u8>>,
    copies: Vec<usize>,
    normalize: Option<NormalizeArg>,
) -> PyResult<Bound<'py, PyAny>> {
    let normalise = normalize.map(normalise_arg).transpose()?;
    if parts.is_empty() || parts.len() != copies.len() {
        return Err(Error::InvalidArgument(format!(
            "{} parts and {} copy counts (one each, at least one part)",
            parts.len(),
            copies.len()
        ))
        .into());
    }
    let mut joined = Vec::with_capacity(parts.len());
    for (part, &n) in parts.iter().zip(&copies) {
        let row_len = part.shape()[1];
        let values = part.as_slice().map_err(|_| {
            Error::InvalidArgument("patch rows must be a C-contiguous array".into())
        })?;
        joined.push((values, row_len, n));
    }
    let row_len = joined[0].1 * joined[0].2;
    let value_bytes = if normalise.is_some() { 4 } else { 1 };
    let rows = py.detach(|| match &normalise {
        Some(normalise) => patches::join_rows_normalised(&joined, normalise),
        None => patches::join_rows(&joined),
    })?;
    let shape = OutputShape {
        height: rows.len() / (row_len * value_bytes).max(1),
        width: row_len,
        channels: value_bytes,
    };
    pixels::array(py, rows, shape)
}

/// The rows a video processor (transformers' `Qwen2VLVideoProcessor`,
/// `Qwen3VLVideoProcessor`) makes of `frames` (T, H, W, 3 uint8,
/// C-contiguous, at its size) with
/// `patches=(patch_size, temporal_patch_size, merge_size)`: each group of
/// temporal-patch consecutive frames laid out as an image's rows with frame
/// `t` in temporal slot `t`, the last group filled with the last frame.
/// (rows, row length, 1) uint8, or with `normalize` (as for
/// `decode_image`) (rows, row length, 4), each value's four native-endian
/// float32 bytes. The GIL is released while it lays them out.
#[pyfunction]
#[pyo3(signature = (frames, patches, normalize = None))]
pub fn video_patch_rows<'py>(
    py: Python<'py>,
    frames: PyReadonlyArray4<'py, u8>,
    patches: (usize, usize, usize),
    normalize: Option<NormalizeArg>,
) -> PyResult<Bound<'py, PyAny>> {
    let grid = grid_arg(Some(patches), normalize)?.expect("patches given");
    let shape = frames.shape();
    let (count, height, width) = (shape[0], shape[1], shape[2]);
    if shape[3] != 3 {
        return Err(Error::InvalidArgument(format!(
            "video patch rows need RGB frames, not {} channels",
            shape[3]
        ))
        .into());
    }
    let video = frames
        .as_slice()
        .map_err(|_| Error::InvalidArgument("frames must be a C-contiguous array".into()))?;
    let total = grid.video_bytes(count, height, width)?;
    let rows = py.detach(|| -> crate::errors::Result<Vec<u8>> {
        let mut out = vec![0u8; total];
        grid.write_video(video, count, height, width, &mut out)?;
        Ok(out)
    })?;
    let row_len = grid.row_len();
    let value_bytes = grid.value_bytes();
    let shape = OutputShape {
        height: rows.len() / (row_len * value_bytes),
        width: row_len,
        channels: value_bytes,
    };
    pixels::array(py, rows, shape)
}
