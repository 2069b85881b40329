//! A sampled video published as one slot: the frames are decoded straight
//! into registered memory, so the only copy of them is the one a worker
//! READs.

use super::{Capture, Conversion};
use crate::errors::{Error, Result};
use crate::publisher::{cancelled, BatchControl, PublishedSlot, Publisher};
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
/// when no frame decodes. After [`Publisher::cancel`] of `control` (the
/// request went away) the wait for a slot and the decoding stop, and a
/// video published by then is freed: the call fails with
/// [`Error::Cancelled`].
pub fn publish_video(
    publisher: &Publisher,
    capture: &mut Capture,
    wanted: &[usize],
    resize: Option<&Target>,
    control: &BatchControl,
) -> Result<PublishedVideo> {
    if wanted.is_empty() {
        return Err(Error::InvalidArgument("no frame index to sample".into()));
    }
    let capacity = capture.sampled_bytes(wanted, resize)?;
    let frame_bytes = capture.frame_bytes(resize);
    let codec = capture.info().codec.clone();
    let mut indices = Vec::new();
    let stop = || control.is_cancelled().then(cancelled);
    if let Some(error) = stop() {
        return Err(error);
    }
    let slot = publisher.publish_filled(capacity, Some(control), |out| {
        indices = capture.read_frames_until(wanted, Conversion::BgrSwapped, resize, out, &stop)?;
        if indices.is_empty() {
            return Err(Error::Video(format!(
                "no frame of the video could be decoded ({codec})"
            )));
        }
        Ok(indices.len() * frame_bytes)
    })?;
    publisher.keep_for(control, &slot)?;
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
