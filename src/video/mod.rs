//! Video decoding with the frames and numbers of vLLM's `opencv` loader.
//!
//! pixelwire links its own decode-only LGPL FFmpeg 9.0.2 (the version
//! opencv-python-headless 5.1 bundles) through a small C shim
//! (`crates/pixelwire-ffmpeg-sys`) that repeats OpenCV's open, grab and
//! retrieve steps. This module is the safe layer over it: [`Capture`] opens
//! an in-memory file, reports what `cv2.VideoCapture` reports, and reads the
//! wanted frames in decode order, converting only those to RGB. Which frames
//! a loader wants is the Python layer's business (`pixelwire.video`).

mod capture;
mod limits;
mod publish;

pub use capture::{Capture, Conversion, EndCheck, Frames, StreamInfo};
pub use limits::VideoLimits;
pub use publish::{publish_video, PublishedVideo};
