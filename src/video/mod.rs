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
mod pace;
mod publish;
mod sample_tables;
mod turns;

pub use capture::{Capture, Conversion, EndCheck, Frames, PieceTimes, StreamInfo};
pub use limits::VideoLimits;
pub use publish::{publish_video, PublishedVideo};
pub use turns::DecodeTurns;

use pixelwire_ffmpeg_sys as ffi;

/// The demuxers, input protocols and decoders the bundled FFmpeg holds
/// (SECURITY.md lists them; a test keeps the list and the build in step).
pub fn ffmpeg_components() -> Vec<(&'static str, Vec<String>)> {
    [
        ("demuxers", ffi::PW_DEMUXERS),
        ("protocols", ffi::PW_INPUT_PROTOCOLS),
        ("decoders", ffi::PW_DECODERS),
    ]
    .into_iter()
    .map(|(label, kind)| {
        let names = (0..)
            // SAFETY: the shim returns NULL past the last component, else
            // a static NUL-terminated name.
            .map_while(|index| unsafe {
                let name = ffi::pw_component_name(kind, index);
                (!name.is_null()).then(|| {
                    std::ffi::CStr::from_ptr(name)
                        .to_string_lossy()
                        .into_owned()
                })
            })
            .collect();
        (label, names)
    })
    .collect()
}
