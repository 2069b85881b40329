//! One error enum for the whole crate, mapped onto one Python exception tree.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

/// Every failure pixelwire can report. Each variant maps to exactly one
/// Python exception class (see [`register`]).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// Corrupt or truncated image data.
    #[error("{0}")]
    Decode(String),
    /// The bytes are not an image format pixelwire decodes.
    #[error("{0}")]
    UnsupportedFormat(String),
    /// The image (or one of its parts) is over a configured limit.
    #[error("{0}")]
    ImageTooLarge(String),
    /// A caller passed an argument that can never work (bad mode, ...).
    #[error("{0}")]
    InvalidArgument(String),
    /// A URL or its inline payload is malformed (bad `data:` URL, bad base64).
    #[error("{0}")]
    InvalidData(String),
    /// A pixel descriptor is malformed, out of bounds or inconsistent.
    #[error("{0}")]
    Descriptor(String),
    /// A NIXL transfer failed, timed out, or delivered pixels that do not
    /// match their content hash.
    #[error("{0}")]
    Transfer(String),
    /// No pool slot became free within the acquire timeout.
    #[error("{0}")]
    PoolExhausted(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn decode(msg: impl Into<String>) -> Self {
        Error::Decode(msg.into())
    }
}

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
    "The image is over a configured limit (bytes, pixels or side)."
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
    "A NIXL transfer failed, timed out or failed verification."
);
create_exception!(
    pixelwire,
    PoolExhausted,
    PixelwireError,
    "No registered pool slot became free within the acquire timeout."
);

impl From<Error> for PyErr {
    fn from(err: Error) -> PyErr {
        match err {
            Error::Decode(m) => DecodeError::new_err(m),
            Error::UnsupportedFormat(m) => UnsupportedFormat::new_err(m),
            Error::ImageTooLarge(m) => ImageTooLarge::new_err(m),
            Error::InvalidArgument(m) => PyValueError::new_err(m),
            Error::InvalidData(m) => FetchError::new_err(m),
            Error::Descriptor(m) => DescriptorError::new_err(m),
            Error::Transfer(m) => TransferError::new_err(m),
            Error::PoolExhausted(m) => PoolExhausted::new_err(m),
        }
    }
}

/// Adds the exception classes to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PixelwireError", py.get_type::<PixelwireError>())?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("UnsupportedFormat", py.get_type::<UnsupportedFormat>())?;
    m.add("ImageTooLarge", py.get_type::<ImageTooLarge>())?;
    m.add("FetchError", py.get_type::<FetchError>())?;
    m.add("BlockedURL", py.get_type::<BlockedURL>())?;
    m.add("DescriptorError", py.get_type::<DescriptorError>())?;
    m.add("TransferError", py.get_type::<TransferError>())?;
    m.add("PoolExhausted", py.get_type::<PoolExhausted>())?;
    Ok(())
}
