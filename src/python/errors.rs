//! The Python exception tree, and the mapping of [`Error`] onto it.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict};

use crate::agent::ReadError;
use crate::errors::Error;

create_exception!(
    pixelwire,
    PixelwireError,
    PyException,
    "Base class of every pixelwire error."
);
create_exception!(
    pixelwire,
    DecodeError,
    PixelwireError,
    "The image data is corrupt, truncated or cannot be decoded."
);
create_exception!(
    pixelwire,
    UnsupportedFormat,
    DecodeError,
    "The data is not in an image format pixelwire decodes."
);
create_exception!(
    pixelwire,
    ImageTooLarge,
    DecodeError,
    "The image is over a configured limit (attributes: setting, limit, actual)."
);
create_exception!(
    pixelwire,
    VideoDecodeError,
    DecodeError,
    "The video cannot be read: not a supported container, corrupt or truncated, no video stream or no decodable frame."
);
create_exception!(
    pixelwire,
    UnsupportedVideo,
    VideoDecodeError,
    "The video stream is in a codec pixelwire does not decode."
);
create_exception!(
    pixelwire,
    UnidentifiedMedia,
    DecodeError,
    "Bytes for vLLM's own video or audio loader are not one media container pixelwire identifies."
);
create_exception!(
    pixelwire,
    VideoFrameCountChanged,
    VideoDecodeError,
    "A read found the frame count the capture gave before it wrong (the end-of-stream check was shared with the read): open the video again with settle_count=True and sample again."
);
create_exception!(
    pixelwire,
    VideoTooLarge,
    ImageTooLarge,
    "The video is over a VideoLimits setting (attributes: setting, limit, actual)."
);
create_exception!(
    pixelwire,
    FetchError,
    PixelwireError,
    "An image URL could not be fetched (attributes: status, retryable)."
);
create_exception!(
    pixelwire,
    BlockedURL,
    FetchError,
    "An image URL was refused by the SSRF guard or the domain allow-list."
);
create_exception!(
    pixelwire,
    DescriptorError,
    PixelwireError,
    "A pixel descriptor is malformed, out of bounds or inconsistent."
);
create_exception!(
    pixelwire,
    TransferError,
    PixelwireError,
    "A NIXL transfer failed, timed out or failed verification (attribute: may_land)."
);
create_exception!(
    pixelwire,
    PoolExhausted,
    PixelwireError,
    "No registered pool slot became free within the acquire timeout."
);
create_exception!(
    pixelwire,
    Cancelled,
    PixelwireError,
    "The caller gave the work up (its request went away) before it was done."
);

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        match err {
            Error::Batch { index, error } => batch_error(index, *error),
            Error::Decode(m) => DecodeError::new_err(m),
            Error::UnsupportedFormat(m) => UnsupportedFormat::new_err(m),
            Error::ImageTooLarge(m) => ImageTooLarge::new_err(m),
            Error::OverLimit {
                message,
                setting,
                limit,
                actual,
            } => over_limit::<ImageTooLarge>(message, setting, limit, actual),
            Error::Video(m) => VideoDecodeError::new_err(m),
            Error::UnsupportedVideo(m) => UnsupportedVideo::new_err(m),
            Error::UnidentifiedMedia(m) => UnidentifiedMedia::new_err(m),
            Error::VideoFrameCountChanged(m) => VideoFrameCountChanged::new_err(m),
            Error::VideoOverLimit {
                message,
                setting,
                limit,
                actual,
            } => over_limit::<VideoTooLarge>(message, setting, limit, actual),
            Error::InvalidArgument(m) => PyValueError::new_err(m),
            Error::InvalidData(m) => FetchError::new_err(m),
            Error::Descriptor(m) => DescriptorError::new_err(m),
            Error::Transfer(m) => TransferError::new_err(m),
            Error::PoolExhausted(m) => PoolExhausted::new_err(m),
            Error::Cancelled(m) => Cancelled::new_err(m),
        }
    }
}

/// A failed READ: a `TransferError` built with `may_land`, whether bytes
/// may still arrive in the destination. Only a READ that was posted can
/// land, and those fail as transfers; a READ refused before (a bad
/// descriptor, no receive slot) raises its own class, with nothing to land.
impl From<ReadError> for PyErr {
    fn from(failed: ReadError) -> PyErr {
        let message = match failed.error {
            Error::Transfer(message) => message,
            other => {
                debug_assert!(!failed.may_land, "only a posted READ may land: {other}");
                return PyErr::from(other);
            }
        };
        Python::attach(|py| {
            let kwargs = [("may_land", failed.may_land)].into_py_dict(py)?;
            py.get_type::<TransferError>()
                .call((message,), Some(&kwargs))
                .map(PyErr::from_value)
        })
        .unwrap_or_else(|err| err)
    }
}

/// An `ImageTooLarge` (or subclass) carrying the limit that was exceeded.
fn over_limit<T: pyo3::PyTypeInfo>(
    message: String,
    setting: &'static str,
    limit: u64,
    actual: u64,
) -> PyErr {
    Python::attach(|py| {
        let kwargs = [
            ("setting", setting.into_pyobject(py)?.into_any()),
            ("limit", limit.into_pyobject(py)?.into_any()),
            ("actual", actual.into_pyobject(py)?.into_any()),
        ]
        .into_py_dict(py)?;
        py.get_type::<T>()
            .call((message,), Some(&kwargs))
            .map(PyErr::from_value)
    })
    .unwrap_or_else(|err| err)
}

/// The exception of input `index` of a batch: the class its own error maps
/// to, with the position in the message and, for the `DecodeError` family,
/// as the `index` its constructor sets (any other class gets the attribute
/// set afterwards).
fn batch_error(index: usize, error: Error) -> PyErr {
    let message = format!("image {index}: {error}");
    Python::attach(|py| {
        let kwargs = PyDict::new(py);
        let class = match &error {
            Error::Decode(_) => py.get_type::<DecodeError>(),
            Error::UnsupportedFormat(_) => py.get_type::<UnsupportedFormat>(),
            Error::ImageTooLarge(_) => py.get_type::<ImageTooLarge>(),
            Error::OverLimit {
                setting,
                limit,
                actual,
                ..
            } => {
                let filled = kwargs
                    .set_item("setting", *setting)
                    .and_then(|()| kwargs.set_item("limit", *limit))
                    .and_then(|()| kwargs.set_item("actual", *actual));
                if let Err(failed) = filled {
                    return failed;
                }
                py.get_type::<ImageTooLarge>()
            }
            _ => {
                let err = PyErr::from(error);
                return match err.value(py).setattr("index", index) {
                    Ok(()) => err,
                    Err(failed) => failed,
                };
            }
        };
        let made = kwargs
            .set_item("index", index)
            .and_then(|()| class.call((message,), Some(&kwargs)));
        match made {
            Ok(value) => PyErr::from_value(value),
            Err(failed) => failed,
        }
    })
}

/// Constructors for the exceptions that carry data, set for every subclass
/// too. Plain Python, since the classes are made by `create_exception!`.
/// `DecodeError(message, *, index=None)`: `index` is the position of the
/// failed input in a `decode_many` batch (None outside one).
/// `FetchError(message, *, status=None, retryable=False)`: the HTTP status
/// (None when not HTTP) and whether a retry may succeed.
/// `ImageTooLarge(message, *, setting=None, limit=None, actual=None)`: the
/// `Limits` field the image is over, its value and the image's (None for a
/// decoder's own memory bound).
/// `TransferError(message, *, may_land=False)`: whether a failed READ may
/// still write the caller's memory it was reading into.
const DATA_CARRYING_INITS: &std::ffi::CStr =
    c"def fetch_error_init(self, message='', *args, status=None, retryable=False):
    Exception.__init__(self, message, *args)
    self.status = status
    self.retryable = retryable

def decode_error_init(self, message='', *args, index=None):
    Exception.__init__(self, message, *args)
    self.index = index

def transfer_error_init(self, message='', *args, may_land=False):
    Exception.__init__(self, message, *args)
    self.may_land = may_land

def image_too_large_init(self, message='', *args, index=None, setting=None, limit=None, actual=None):
    Exception.__init__(self, message, *args)
    self.index = index
    self.setting = setting
    self.limit = limit
    self.actual = actual
";

/// Adds the exception classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let scope = PyDict::new(py);
    py.run(DATA_CARRYING_INITS, Some(&scope), None)?;
    for (class, init) in [
        (py.get_type::<FetchError>(), "fetch_error_init"),
        (py.get_type::<DecodeError>(), "decode_error_init"),
        (py.get_type::<ImageTooLarge>(), "image_too_large_init"),
        (py.get_type::<TransferError>(), "transfer_error_init"),
    ] {
        let init = scope.get_item(init)?.expect("the snippet defines it");
        class.setattr("__init__", init)?;
    }
    m.add("PixelwireError", py.get_type::<PixelwireError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("UnsupportedFormat", py.get_type::<UnsupportedFormat>())?;
    m.add("ImageTooLarge", py.get_type::<ImageTooLarge>())?;
    m.add("VideoDecodeError", py.get_type::<VideoDecodeError>())?;
    m.add("UnsupportedVideo", py.get_type::<UnsupportedVideo>())?;
    m.add("UnidentifiedMedia", py.get_type::<UnidentifiedMedia>())?;
    m.add("VideoTooLarge", py.get_type::<VideoTooLarge>())?;
    m.add(
        "VideoFrameCountChanged",
        py.get_type::<VideoFrameCountChanged>(),
    )?;
    m.add("FetchError", py.get_type::<FetchError>())?;
    m.add("BlockedURL", py.get_type::<BlockedURL>())?;
    m.add("DescriptorError", py.get_type::<DescriptorError>())?;
    m.add("TransferError", py.get_type::<TransferError>())?;
    m.add("PoolExhausted", py.get_type::<PoolExhausted>())?;
    m.add("Cancelled", py.get_type::<Cancelled>())?;
    Ok(())
}
