//! The `video` harness: open an in-memory video through the FFmpeg shim,
//! read its headers, decode a few sampled frames, all under small limits.

use std::collections::BTreeSet;

use pixelwire::errors::Error;
use pixelwire::video::{Capture, Conversion, EndCheck, VideoLimits};

/// Bytes of the video target's header, before the file.
pub const VIDEO_HEADER: usize = 4;

/// `video`: 4 header bytes, then the file.
///
/// * `h[0]`: bit 0 two decoder threads (else one); bit 1 RGB24 straight
///   from swscale (else OpenCV's BGR24 then a swap); bits 2-3 `max_pixels`
///   (2^12, 2^16, 2^18, 2^20); bits 4-5 `max_seconds` (1, 10, 60, 3600);
///   bit 6 `max_bytes` one below the file's length (must refuse); bit 7
///   the frame count's end-of-stream check shared with the read (else
///   settled at open).
/// * `h[1]`: bits 0-1 frames sampled (1..=4; `max_frames` is 3, so 4 must
///   refuse); bits 2-3 `max_decode_pixels` (2^16, 2^20, 2^24, none).
/// * `h[2]`, `h[3]`: the first sampled index and the step between them.
///
/// Checks: no crash, hang or unbounded memory (libFuzzer's -timeout and
/// -rss_limit_mb); what `open` accepts is within the limits; a read returns
/// sorted, distinct indices among those asked for and exactly their frames'
/// bytes, or `VideoFrameCountChanged` from a count left provisional at open
/// (then settled to another); a read settles the count; a capture reads
/// once.
pub fn video_one(data: &[u8]) {
    crate::init();
    video_inner(data);
    crate::after("video", data);
}

fn video_inner(data: &[u8]) {
    if data.len() < VIDEO_HEADER {
        return;
    }
    let (h, file) = data.split_at(VIDEO_HEADER);
    let tight = h[0] & 0x40 != 0 && !file.is_empty();
    let limits = VideoLimits {
        max_bytes: if tight { file.len() - 1 } else { file.len() },
        max_frames: 3,
        max_pixels: [1u64 << 12, 1 << 16, 1 << 18, 1 << 20][usize::from((h[0] >> 2) & 3)],
        max_frame_bytes: 4 << 20,
        max_seconds: [1u64, 10, 60, 3600][usize::from((h[0] >> 4) & 3)],
        max_decode_pixels: [1u64 << 16, 1 << 20, 1 << 24, u64::MAX][usize::from((h[1] >> 2) & 3)],
    };
    let threads = 1 + usize::from(h[0] & 1);
    let conversion = if h[0] & 2 != 0 {
        Conversion::RgbDirect
    } else {
        Conversion::BgrSwapped
    };
    let end_check = if h[0] & 0x80 != 0 {
        EndCheck::SharedWithRead
    } else {
        EndCheck::AtOpen
    };
    let mut capture = match Capture::open(
        Box::new(file.to_vec()),
        threads,
        limits,
        end_check,
        None,
        None,
    ) {
        Ok(capture) => capture,
        Err(Error::Video(_) | Error::UnsupportedVideo(_) | Error::VideoOverLimit { .. }) => return,
        Err(other) => panic!("open failed with an error of another kind: {other:?}"),
    };
    assert!(!tight, "opened {} bytes over max_bytes", file.len());
    let info = capture.info().clone();
    assert!(info.width >= 1 && info.height >= 1, "{info:?}");
    assert!(
        u64::from(info.width) * u64::from(info.height) <= limits.max_pixels,
        "{info:?} over max_pixels {}",
        limits.max_pixels
    );
    if info.duration.is_finite() {
        assert!(
            info.duration <= limits.max_seconds as f64,
            "{info:?} over max_seconds"
        );
    }
    if info.fps.is_finite() && info.fps > 0.0 {
        let claimed = info.header_frame_count as f64 / info.fps;
        assert!(
            claimed <= limits.max_seconds as f64 || !claimed.is_finite(),
            "{info:?} over max_seconds {}",
            limits.max_seconds
        );
    }

    let count = usize::from(h[1] % 4) + 1;
    let (first, step) = (usize::from(h[2] % 32), usize::from(h[3] % 16));
    let wanted: Vec<usize> = (0..count).map(|i| first + i * step).collect();
    let distinct = wanted.iter().collect::<BTreeSet<_>>().len();
    let mut refused = false;
    match capture.read_frames(&wanted, conversion, None) {
        Ok(frames) => {
            assert!(
                distinct <= limits.max_frames,
                "read {distinct} frames over max_frames"
            );
            let frame_bytes = frames.height * frames.width * 3;
            assert_eq!(
                (frames.width, frames.height),
                (info.width as usize, info.height as usize)
            );
            assert_eq!(frames.pixels.len(), frames.indices.len() * frame_bytes);
            assert!(
                frames.indices.windows(2).all(|w| w[0] < w[1]),
                "{:?}",
                frames.indices
            );
            assert!(
                frames.indices.iter().all(|i| wanted.contains(i)),
                "{:?}",
                frames.indices
            );
        }
        Err(Error::VideoOverLimit { setting, .. }) => {
            refused = true;
            assert!(
                matches!(
                    setting,
                    "max_frames" | "max_frame_bytes" | "max_decode_pixels"
                ),
                "read refused by {setting}"
            );
        }
        Err(Error::VideoFrameCountChanged(_)) => {
            assert!(!info.frame_count_settled, "a settled count changed");
            assert_ne!(capture.info().frame_count, info.frame_count);
        }
        Err(other) => panic!("read failed: {other:?}"),
    }
    assert!(
        capture.info().frame_count_settled || refused,
        "a read left the count provisional"
    );
    assert!(
        capture.read_frames(&wanted, conversion, None).is_err(),
        "a capture read twice"
    );
}
