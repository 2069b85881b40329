//! A sampled video published as one slot: the frames are decoded straight
//! into registered memory, so the only copy of them is the one a worker
//! READs.

use super::{Capture, Conversion};
use crate::errors::{Error, Result};
use crate::publisher::{PublishedSlot, Publisher};
use crate::resize::Target;

/// One published video: `indices.len()` RGB frames of `height x width`,
/// packed in index order.
#[derive(Clone, Debug)]
pub struct PublishedVideo {
    pub slot: PublishedSlot,
    pub indices: Vec<usize>,
    pub height: usize,
    pub width: usize,
}

/// Decodes the frames of `wanted` that decode (as [`Capture::read_frames`])
/// into a slot of `publisher`, each resized to `resize` when given, and
/// publishes them. The slot is sized for every wanted frame, checked
/// against the capture's limits before it is taken; the slot is given back
/// when no frame decodes.
pub fn publish_video(
    publisher: &Publisher,
    capture: &mut Capture,
    wanted: &[usize],
    resize: Option<&Target>,
) -> Result<PublishedVideo> {
    if wanted.is_empty() {
        return Err(Error::InvalidArgument("no frame index to sample".into()));
    }
    let capacity = capture.sampled_bytes(wanted, resize)?;
    let frame_bytes = capture.frame_bytes(resize);
    let codec = capture.info().codec.clone();
    let mut indices = Vec::new();
    let slot = publisher.publish_filled(capacity, None, |out| {
        indices = capture.read_frames_into(wanted, Conversion::BgrSwapped, resize, out)?;
        if indices.is_empty() {
            return Err(Error::Video(format!(
                "no frame of the video could be decoded ({codec})"
            )));
        }
        Ok(indices.len() * frame_bytes)
    })?;
    let info = capture.info();
    let (height, width) = match resize {
        Some(target) => (target.height, target.width),
        None => (info.height as usize, info.width as usize),
    };
    Ok(PublishedVideo {
        slot,
        indices,
        height,
        width,
    })
}
