//! One error enum for the whole crate. Plain Rust: the binding layer
//! (`python/errors.rs`) maps each variant onto one Python exception class.

/// Every failure pixelwire can report. Each variant maps to exactly one
/// Python exception class.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// Corrupt or truncated image data.
    #[error("{0}")]
    Decode(String),
    /// The bytes are not an image format pixelwire decodes.
    #[error("{0}")]
    UnsupportedFormat(String),
    /// The image (or one of its parts) is too large to decode: a decoder's
    /// own memory bound, or a size that does not fit in memory.
    #[error("{0}")]
    ImageTooLarge(String),
    /// The image is over one of the caller's [`crate::decode::Limits`],
    /// found from the header before any pixel memory is taken. `setting` is
    /// the field of `Limits` (`max_bytes`, `max_pixels`, `max_side`).
    #[error("{message}")]
    OverLimit {
        message: String,
        setting: &'static str,
        limit: u64,
        actual: u64,
    },
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
    /// The caller gave the work up (its request went away) before it was done.
    #[error("{0}")]
    Cancelled(String),
    /// A video that cannot be read: not a container pixelwire demuxes,
    /// corrupt or truncated headers, no video stream, or no decodable frame.
    #[error("{0}")]
    Video(String),
    /// A read found that the frame count a capture gave before it (its
    /// end-of-stream check shared with the read) was not OpenCV's: the
    /// frames were sampled over the wrong count. The caller opens the video
    /// again with the check settled at open and samples again.
    #[error("{0}")]
    VideoFrameCountChanged(String),
    /// Bytes for another party's decoder that are not one media container
    /// pixelwire identifies (`crate::identify`).
    #[error("{0}")]
    UnidentifiedMedia(String),
    /// A video stream in a codec this build does not decode.
    #[error("{0}")]
    UnsupportedVideo(String),
    /// A video over one of the caller's [`crate::video::VideoLimits`]
    /// (`setting` names the field), found before any frame memory is taken.
    #[error("{message}")]
    VideoOverLimit {
        message: String,
        setting: &'static str,
        limit: u64,
        actual: u64,
    },
    /// Input `index` of a batch failed with `error`; the Python class is
    /// `error`'s, with the index as an attribute.
    #[error("image {index}: {error}")]
    Batch { index: usize, error: Box<Error> },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn decode(msg: impl Into<String>) -> Self {
        Error::Decode(msg.into())
    }
}
