//! Bounds on one video, checked from the container and codec headers before
//! any frame memory exists.

use crate::errors::{Error, Result};

/// What one video may cost. Every check runs before the memory it guards is
/// taken: `max_bytes` on the encoded input, `max_pixels` while FFmpeg probes
/// the stream (its decoders refuse bigger frames), `max_seconds` on the
/// headers' duration before the first frame is decoded, `max_frames` and
/// `max_frame_bytes` on the sampled frames before the output exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VideoLimits {
    /// Encoded size in bytes.
    pub max_bytes: usize,
    /// Frames sampled (returned) from one video.
    pub max_frames: usize,
    /// Pixels of one frame (width x height).
    pub max_pixels: u64,
    /// Bytes of all sampled RGB frames together.
    pub max_frame_bytes: u64,
    /// Seconds the headers say the video lasts (its duration, or its frame
    /// count over its frame rate, whichever is longer). Sampling spreads
    /// over that span and decoding runs up to the last sampled frame, so a
    /// tiny file claiming hours would otherwise be read as hours.
    pub max_seconds: u64,
    /// Pixels decoded for one video: every frame up to the last sampled
    /// one, times its pixels, whatever the container says of its rate or
    /// duration (a file can claim a million frames a second and hold hours
    /// of them). Checked from the headers before the read, and counted as
    /// the decoder runs, where each decoding pass (the frame count's check
    /// at the end of the stream, then the read) may take it once.
    pub max_decode_pixels: u64,
}

impl Default for VideoLimits {
    fn default() -> Self {
        VideoLimits {
            max_bytes: 1024 * 1024 * 1024,
            max_frames: 1024,
            // 8K UHD.
            max_pixels: 7680 * 4320,
            max_frame_bytes: 4 * 1024 * 1024 * 1024,
            // A feature film.
            max_seconds: 3 * 3600,
            // The decoding of three hours of 1080p at 30 frames a second,
            // as many pixels as an hour of 4K at 22.5: `max_seconds` of
            // ordinary video, whatever rate a header claims.
            max_decode_pixels: 3 * 3600 * 30 * 1920 * 1080,
        }
    }
}

fn over(what: String, setting: &'static str, limit: u64, actual: u64) -> Error {
    Error::VideoOverLimit {
        message: format!("{what}, over the limit of {limit} ({setting})"),
        setting,
        limit,
        actual,
    }
}

impl VideoLimits {
    pub fn check_encoded(&self, len: usize) -> Result<()> {
        if len > self.max_bytes {
            return Err(over(
                format!("encoded video is {len} bytes"),
                "max_bytes",
                self.max_bytes as u64,
                len as u64,
            ));
        }
        Ok(())
    }

    pub fn check_frame_size(&self, width: u32, height: u32) -> Result<()> {
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.max_pixels {
            return Err(over(
                format!("video frames are {width}x{height} ({pixels} pixels)"),
                "max_pixels",
                self.max_pixels,
                pixels,
            ));
        }
        Ok(())
    }

    /// The longer of `duration` and `frame_count / fps`, as the headers
    /// state them; a value a header leaves unknown (negative, not finite)
    /// counts for nothing.
    pub fn check_seconds(&self, duration: f64, frame_count: i64, fps: f64) -> Result<()> {
        let known = |s: f64| if s.is_finite() && s > 0.0 { s } else { 0.0 };
        let by_count = if fps.is_finite() && fps > 0.0 {
            known(frame_count as f64 / fps)
        } else {
            0.0
        };
        let seconds = known(duration).max(by_count);
        if seconds > self.max_seconds as f64 {
            let source = if by_count > known(duration) {
                format!("{frame_count} frames at {fps} fps")
            } else {
                "its duration".to_string()
            };
            return Err(over(
                format!("video claims {seconds:.0} seconds ({source})"),
                "max_seconds",
                self.max_seconds,
                seconds.ceil().min(u64::MAX as f64) as u64,
            ));
        }
        Ok(())
    }

    /// Decoding `frames` frames of `pixels` each (the frames up to and
    /// including the last sampled one).
    pub fn check_decode(&self, frames: u64, pixels: u64) -> Result<()> {
        let total = frames.saturating_mul(pixels);
        if total > self.max_decode_pixels {
            return Err(over(
                format!(
                    "decoding the video takes {frames} frames of {pixels} pixels ({total} pixels)"
                ),
                "max_decode_pixels",
                self.max_decode_pixels,
                total,
            ));
        }
        Ok(())
    }

    /// `frames` sampled frames of `frame_bytes` each.
    pub fn check_sampled(&self, frames: usize, frame_bytes: u64) -> Result<()> {
        if frames > self.max_frames {
            return Err(over(
                format!("{frames} frames sampled"),
                "max_frames",
                self.max_frames as u64,
                frames as u64,
            ));
        }
        let total = (frames as u64).saturating_mul(frame_bytes);
        if total > self.max_frame_bytes {
            return Err(over(
                format!("{frames} sampled frames take {total} bytes"),
                "max_frame_bytes",
                self.max_frame_bytes,
                total,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_name_the_setting_that_was_exceeded() {
        let limits = VideoLimits {
            max_bytes: 10,
            max_frames: 4,
            max_pixels: 100,
            max_frame_bytes: 1000,
            max_seconds: 60,
            max_decode_pixels: 10_000,
        };
        let setting = |r: Result<()>| match r {
            Err(Error::VideoOverLimit { setting, .. }) => setting,
            other => panic!("{other:?}"),
        };
        assert_eq!(setting(limits.check_encoded(11)), "max_bytes");
        assert_eq!(setting(limits.check_frame_size(11, 10)), "max_pixels");
        assert_eq!(setting(limits.check_sampled(5, 1)), "max_frames");
        assert_eq!(setting(limits.check_sampled(4, 251)), "max_frame_bytes");
        assert!(limits.check_sampled(4, 250).is_ok());
        assert!(limits.check_frame_size(10, 10).is_ok());
        assert_eq!(setting(limits.check_seconds(60.5, 0, 25.0)), "max_seconds");
        assert_eq!(setting(limits.check_decode(101, 100)), "max_decode_pixels");
        assert!(limits.check_decode(100, 100).is_ok());
        // A header's frame count cannot overflow the product into a pass.
        assert_eq!(
            setting(limits.check_decode(u64::MAX, 2)),
            "max_decode_pixels"
        );
        assert_eq!(
            setting(limits.check_seconds(1.0, 1_000_000_000, 25.0)),
            "max_seconds"
        );
        assert!(limits.check_seconds(60.0, 1500, 25.0).is_ok());
    }

    /// Unknown durations (FFmpeg's AV_NOPTS_VALUE scaled) and frame rates
    /// do not count as long ones.
    #[test]
    fn unknown_header_values_are_not_over_max_seconds() {
        let limits = VideoLimits::default();
        assert!(limits.check_seconds(-9.2e12, 10, 0.0).is_ok());
        assert!(limits.check_seconds(f64::NAN, 10, f64::INFINITY).is_ok());
    }
}
