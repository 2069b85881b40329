//! `VideoLimits` and `VideoCapture`: the thin binding over `crate::video`.
//! Opening and reading run with the GIL released.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::args::Encoded;
use super::control::NativeBatchControl;
use super::decode::{resize_target, ResizeArg};
use crate::video::{self, Capture, Conversion, EndCheck, PieceTimes};

/// Bounds on one video, checked before the memory they guard is taken.
#[pyclass(module = "pixelwire", name = "VideoLimits", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct PyVideoLimits {
    pub inner: video::VideoLimits,
}

#[pymethods]
impl PyVideoLimits {
    #[new]
    #[pyo3(signature = (*, max_bytes = None, max_frames = None, max_pixels = None, max_frame_bytes = None, max_seconds = None, max_decode_pixels = None))]
    fn new(
        max_bytes: Option<usize>,
        max_frames: Option<usize>,
        max_pixels: Option<u64>,
        max_frame_bytes: Option<u64>,
        max_seconds: Option<u64>,
        max_decode_pixels: Option<u64>,
    ) -> Self {
        let d = video::VideoLimits::default();
        PyVideoLimits {
            inner: video::VideoLimits {
                max_bytes: max_bytes.unwrap_or(d.max_bytes),
                max_frames: max_frames.unwrap_or(d.max_frames),
                max_pixels: max_pixels.unwrap_or(d.max_pixels),
                max_frame_bytes: max_frame_bytes.unwrap_or(d.max_frame_bytes),
                max_seconds: max_seconds.unwrap_or(d.max_seconds),
                max_decode_pixels: max_decode_pixels.unwrap_or(d.max_decode_pixels),
            },
        }
    }

    #[getter]
    fn max_bytes(&self) -> usize {
        self.inner.max_bytes
    }

    #[getter]
    fn max_frames(&self) -> usize {
        self.inner.max_frames
    }

    #[getter]
    fn max_pixels(&self) -> u64 {
        self.inner.max_pixels
    }

    #[getter]
    fn max_frame_bytes(&self) -> u64 {
        self.inner.max_frame_bytes
    }

    #[getter]
    fn max_seconds(&self) -> u64 {
        self.inner.max_seconds
    }

    #[getter]
    fn max_decode_pixels(&self) -> u64 {
        self.inner.max_decode_pixels
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        format!(
            "VideoLimits(max_bytes={}, max_frames={}, max_pixels={}, max_frame_bytes={}, max_seconds={}, \
             max_decode_pixels={})",
            l.max_bytes, l.max_frames, l.max_pixels, l.max_frame_bytes, l.max_seconds, l.max_decode_pixels
        )
    }
}

/// The encoded bytes a capture reads from while the GIL is released: a
/// `bytes` object kept alive (immutable, so no copy), or a copy of any other
/// buffer.
enum Source {
    Bytes {
        _owner: Py<PyBytes>,
        ptr: *const u8,
        len: usize,
    },
    Owned(Vec<u8>),
}

// SAFETY: a `bytes` object's buffer never changes or moves while `_owner`
// holds a reference to it, so reading it from other threads is sound.
unsafe impl Send for Source {}
unsafe impl Sync for Source {}

impl AsRef<[u8]> for Source {
    fn as_ref(&self) -> &[u8] {
        match self {
            // SAFETY: see `Send` above; `ptr`/`len` describe the owner's buffer.
            Source::Bytes { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Source::Owned(v) => v,
        }
    }
}

/// An opened in-memory video, read as `cv2.VideoCapture` reads it.
#[pyclass(module = "pixelwire._native", name = "VideoCapture")]
pub struct PyVideoCapture {
    inner: Option<Capture>,
    /// Packets the decoder was given, as the read left them.
    packets_decoded: u64,
    /// Where the read's time went, piece by piece.
    times: Vec<PieceTimes>,
}

#[pymethods]
impl PyVideoCapture {
    /// Opens `data` and reads the container and codec headers. `threads`:
    /// the decoder's threads (0: min(cores, 16), as OpenCV). `settle_count`
    /// decodes the end of the stream here for the frame count, as OpenCV;
    /// without it that work is shared with `read` where it can be, and
    /// `frame_count` may be provisional until `read` settles it (raising
    /// `VideoFrameCountChanged` when it was wrong). Once `control` is
    /// cancelled, the open and the read stop within a frame and raise
    /// `Cancelled`. With `client` (whose decoding this is), the open and
    /// the read take turns with the process's other decodes that name a
    /// client (`configure_video_turns`).
    #[new]
    #[pyo3(signature = (data, *, threads = 0, limits = None, settle_count = false, control = None, client = None))]
    fn new(
        py: Python<'_>,
        data: Encoded<'_>,
        threads: usize,
        limits: Option<PyRef<'_, PyVideoLimits>>,
        settle_count: bool,
        control: Option<PyRef<'_, NativeBatchControl>>,
        client: Option<String>,
    ) -> PyResult<Self> {
        let limits = limits.map(|l| l.inner).unwrap_or_default();
        let source = match data {
            Encoded::Borrowed(b) => {
                let bytes = b.as_bytes();
                Source::Bytes {
                    ptr: bytes.as_ptr(),
                    len: bytes.len(),
                    _owner: b.unbind(),
                }
            }
            Encoded::Owned(v) => Source::Owned(v),
        };
        let end_check = if settle_count {
            EndCheck::AtOpen
        } else {
            EndCheck::SharedWithRead
        };
        let stop = control.map(|control| control.inner.stop_flag());
        let capture = py.detach(|| {
            Capture::open(
                Box::new(source),
                threads,
                limits,
                end_check,
                stop,
                client.as_deref(),
            )
        })?;
        Ok(PyVideoCapture {
            inner: Some(capture),
            packets_decoded: 0,
            times: Vec::new(),
        })
    }

    /// The stream as OpenCV reports it: width, height, frame_count (as vLLM
    /// corrects it), header_frame_count, frame_count_settled, fps, duration,
    /// rotation, threads, codec, pix_fmt.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let info = self.capture()?.info();
        let d = PyDict::new(py);
        d.set_item("width", info.width)?;
        d.set_item("height", info.height)?;
        d.set_item("frame_count", info.frame_count)?;
        d.set_item("header_frame_count", info.header_frame_count)?;
        d.set_item("frame_count_settled", info.frame_count_settled)?;
        d.set_item("fps", info.fps)?;
        d.set_item("duration", info.duration)?;
        d.set_item("rotation", info.rotation)?;
        d.set_item("threads", info.threads)?;
        d.set_item("codec", &info.codec)?;
        d.set_item("pix_fmt", &info.pix_fmt)?;
        Ok(d)
    }

    /// Decodes up to the last of `indices` and returns the decodable ones
    /// among them as a (T, H, W, 3) uint8 RGB array and their sorted
    /// indices; with `resize=(height, width)`, each frame resized to that
    /// size with the named processor arithmetic (as `publish_video` does).
    /// Reads once; the capture is closed afterwards.
    #[pyo3(signature = (indices, *, rgb_direct = false, resize = None, resize_kernel = "torchvision", resize_filter = "bicubic"))]
    fn read<'py>(
        &mut self,
        py: Python<'py>,
        indices: Vec<usize>,
        rgb_direct: bool,
        resize: Option<(usize, usize)>,
        resize_kernel: &str,
        resize_filter: &str,
    ) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
        let target = resize_target(resize.map(ResizeArg::Size), resize_kernel, resize_filter)?;
        let mut capture = self.take()?;
        let conversion = if rgb_direct {
            Conversion::RgbDirect
        } else {
            Conversion::BgrSwapped
        };
        let frames = py.detach(move || capture.read_frames(&indices, conversion, target.as_ref()));
        if let Ok(frames) = &frames {
            self.packets_decoded = frames.packets_decoded;
            self.times.clone_from(&frames.times);
        }
        let frames = frames?;
        let shape = [frames.indices.len(), frames.height, frames.width, 3];
        let array = PyArray1::from_vec(py, frames.pixels).reshape(shape)?;
        Ok((array.into_any(), frames.indices))
    }

    /// The pieces a `read` of `indices` decodes at once, each a list of
    /// sorted indices (one piece: the read is not split). A stream is split
    /// only at IDR pictures of H.264 and HEVC streams whose frames the
    /// skipper numbers, and only with more than one decoder thread.
    fn read_plan(&mut self, py: Python<'_>, indices: Vec<usize>) -> PyResult<Vec<Vec<usize>>> {
        let capture = self.inner.as_mut().ok_or_else(closed)?;
        Ok(py.detach(|| capture.read_plan(&indices)))
    }

    /// Packets the decoder has been given since open: by the end-of-stream
    /// check and, once read, by the read (what skipping leaves to decode).
    fn packets_decoded(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(self.packets_decoded, Capture::packets_decoded)
    }

    /// Where the read's time went, one dict a piece (one: the read was not
    /// split), in frame order: frames (sampled frames kept), threads,
    /// packets (given to its decoder), open_ms (its capture's open),
    /// first_frame_ms (from its read's start to its first kept frame),
    /// decode_ms (its read less conversion), convert_ms (converting its
    /// kept frames). Empty before a read.
    fn read_times<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
        self.times
            .iter()
            .map(|t| {
                let d = PyDict::new(py);
                d.set_item("frames", t.frames)?;
                d.set_item("threads", t.threads)?;
                d.set_item("packets", t.packets)?;
                d.set_item("open_ms", ms(t.open))?;
                d.set_item("first_frame_ms", ms(t.first_frame))?;
                d.set_item("decode_ms", ms(t.decode))?;
                d.set_item("convert_ms", ms(t.convert))?;
                Ok(d)
            })
            .collect()
    }

    /// Frees the decoder now rather than when the object goes.
    fn close(&mut self) {
        self.inner = None;
    }
}

impl PyVideoCapture {
    fn capture(&self) -> PyResult<&Capture> {
        self.inner.as_ref().ok_or_else(closed)
    }

    /// The capture itself, for a caller that reads it (it is read once).
    pub(super) fn take(&mut self) -> PyResult<Capture> {
        self.inner.take().ok_or_else(closed)
    }
}

fn closed() -> PyErr {
    PyErr::from(crate::errors::Error::InvalidArgument(
        "the video capture is closed (frames are read once)".into(),
    ))
}

/// The bundled FFmpeg's demuxers, input protocols and decoders, by kind.
#[pyfunction]
fn ffmpeg_components() -> std::collections::HashMap<&'static str, Vec<String>> {
    crate::video::ffmpeg_components().into_iter().collect()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVideoLimits>()?;
    m.add_function(wrap_pyfunction!(configure_video_turns, m)?)?;
    m.add_class::<PyVideoCapture>()?;
    m.add_function(wrap_pyfunction!(ffmpeg_components, m)?)?;
    Ok(())
}

/// Sets how many of the decodes that name a client run at once (at least
/// one); the others wait for a turn, the client that has had least decoding
/// time first. Returns the number set.
#[pyfunction]
fn configure_video_turns(calls: usize) -> usize {
    let turns = video::DecodeTurns::global();
    turns.configure(calls);
    turns.calls()
}
