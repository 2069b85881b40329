//! [`Capture`]: one in-memory video opened through the C shim, read the way
//! vLLM's `opencv` loader reads a `cv2.VideoCapture`.

use std::collections::BTreeSet;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pixelwire_ffmpeg_sys as ffi;

mod pieces;

use super::pace::Pace;

/// Sequences a read is split at, at most (a 3-hour video with an IDR
/// picture every second has 10,800).
const MAX_SEQUENCES: usize = 1 << 16;
use super::VideoLimits;
use crate::errors::{Error, Result};
use crate::publisher::cancelled;
use crate::resize::Target;

/// What `cv2.VideoCapture` reports about the stream, from its headers.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamInfo {
    /// `CAP_PROP_FRAME_WIDTH` / `_HEIGHT`: the size of every returned
    /// frame, after the rotation (swapped for 90 and 270 degrees).
    pub width: u32,
    pub height: u32,
    /// The frame count vLLM's loader samples over: `CAP_PROP_FRAME_COUNT`
    /// (the container's count, else duration x fps), unless a seek to the
    /// end finds the stream ending more than one frame earlier (vLLM's
    /// `get_video_metadata` check). It may still be too high: frames past
    /// the real end are simply not there.
    pub frame_count: i64,
    /// `CAP_PROP_FRAME_COUNT` as the headers state it.
    pub header_frame_count: i64,
    /// Whether `frame_count` is final. With [`EndCheck::SharedWithRead`] it
    /// may be provisional until the read confirms it (or fails with
    /// [`Error::VideoFrameCountChanged`]).
    pub frame_count_settled: bool,
    /// `CAP_PROP_FPS`.
    pub fps: f64,
    /// The container's duration in seconds (vLLM's metadata uses
    /// `frame_count / fps` instead).
    pub duration: f64,
    /// `CAP_PROP_ORIENTATION_META`: the display matrix's clockwise rotation
    /// in degrees. Frames come back rotated by it when it is 90, 180 or 270,
    /// as OpenCV's `CAP_PROP_ORIENTATION_AUTO` (on by default) does.
    pub rotation: i32,
    /// The decoder's thread count.
    pub threads: u32,
    /// The FFmpeg decoder's name (`h264`, `hevc`, `libdav1d`, ...).
    pub codec: String,
    /// The stream's pixel format (`yuv420p`, `yuv420p10le`, ...).
    pub pix_fmt: String,
}

/// Sampled frames: `indices.len()` RGB frames of `height x width`, packed.
#[derive(Debug)]
pub struct Frames {
    pub pixels: Vec<u8>,
    pub indices: Vec<usize>,
    pub height: usize,
    pub width: usize,
    /// Packets given to the decoder since the capture opened.
    pub packets_decoded: u64,
    /// Where the read's time went, piece by piece.
    pub times: Vec<PieceTimes>,
}

/// Where a read's time went on one of its pieces (a read not split is one
/// piece). Recorded on every read: a few clock reads a piece and two a
/// kept frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct PieceTimes {
    /// Sampled frames the piece kept.
    pub frames: usize,
    /// The piece's decoder threads.
    pub threads: u32,
    /// Packets its decoder was given, by its open and its read.
    pub packets: u64,
    /// Opening its capture (the container's headers; for the capture that
    /// was opened first, also the frame count's check).
    pub open: Duration,
    /// From the start of its read to its first kept frame.
    pub first_frame: Duration,
    /// Its read less the conversion of its kept frames.
    pub decode: Duration,
    /// Converting (and rotating, resizing) its kept frames.
    pub convert: Duration,
}

/// When vLLM's end-of-stream frame count check (OpenCV's seek to the end,
/// which decodes from the last keyframe to the end) is done. `AtOpen`
/// decodes the end there, as OpenCV does. `SharedWithRead` does so only
/// where it cannot be shared: for an H.264 or HEVC stream whose seek to the
/// end lands on an IDR picture, or a VP9 stream whose seek lands on a shown
/// key frame (which resets every reference slot and probability context),
/// with enough packets after it for the header's count, the count is the
/// header's, provisionally, and the read
/// (which decodes those frames from the start anyway) confirms it. A read
/// that cannot settles it then, as `AtOpen` would have, and fails with
/// [`Error::VideoFrameCountChanged`] if the count was wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndCheck {
    AtOpen,
    SharedWithRead,
    /// The count another capture of the same bytes settled (or holds
    /// provisionally, confirmed by its own read): a piece of a read.
    Known(i64),
}

/// The seek to the end's landing, which a read must confirm.
#[derive(Clone, Copy, Debug)]
struct PendingCount {
    landing_pts: i64,
    landing_number: i64,
}

/// What a read saw from the frame the seek to the end landed on (its
/// timestamp) onwards: that frame's number, the last number reached with
/// every frame from there decoding, in presentation order.
struct EndTrack {
    landing_pts: i64,
    from: Option<usize>,
    last: usize,
    last_pts: Option<i64>,
    broken: bool,
}

impl EndTrack {
    fn new(landing_pts: i64) -> EndTrack {
        EndTrack {
            landing_pts,
            from: None,
            last: 0,
            last_pts: None,
            broken: false,
        }
    }

    /// Frame `index` was output with timestamp `pts`.
    fn grabbed(&mut self, index: usize, pts: i64) {
        if self.last_pts.is_some_and(|last| pts <= last) {
            // Timestamps out of order: the landing frame's place in the
            // read need not be its place after the seek.
            self.broken = true;
        }
        self.last_pts = Some(pts);
        if pts == self.landing_pts {
            self.from = Some(index);
        }
        self.last = index;
    }

    /// A frame did not decode: OpenCV's check would stop there.
    fn missed(&mut self) {
        self.broken = true;
    }

    /// Whether OpenCV's check, grabbing from the landing (numbered
    /// `landing_number`) towards `count` - 1, would reach it, so that it
    /// keeps the header's `count`: it needs `count` - 1 - landing_number
    /// more frames, and the read decoded `count` - 1 - from of them.
    fn confirms(&self, pending: &PendingCount, count: i64) -> bool {
        let Some(from) = self.from else {
            return false;
        };
        !self.broken && from as i64 <= pending.landing_number + 1 && self.last as i64 >= count - 1
    }
}

/// What a read makes of each frame: its conversion to RGB and its resize.
#[derive(Clone, Copy)]
pub(super) struct FrameFormat<'a> {
    pub conversion: Conversion,
    pub resize: Option<&'a Target>,
}

/// How a frame becomes RGB. `BgrSwapped` is OpenCV's path (swscale to
/// BGR24, then `cv2.cvtColor(BGR2RGB)`); `RgbDirect` asks swscale for RGB24.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    BgrSwapped,
    RgbDirect,
}

/// Rotates a packed RGB frame of `height x width` clockwise by `degrees`
/// (90, 180 or 270) into `dst`, as `cv::rotate` does.
fn rotate(src: &[u8], height: usize, width: usize, degrees: i32, dst: &mut [u8]) {
    for y in 0..height {
        for x in 0..width {
            let (ty, tx, out_width) = match degrees {
                90 => (x, height - 1 - y, height),
                180 => (height - 1 - y, width - 1 - x, width),
                _ => (width - 1 - x, y, height),
            };
            let from = (y * width + x) * 3;
            let to = (ty * out_width + tx) * 3;
            dst[to..to + 3].copy_from_slice(&src[from..from + 3]);
        }
    }
}

fn applied_rotation(degrees: i32) -> Option<i32> {
    matches!(degrees, 90 | 180 | 270).then_some(degrees)
}

/// An opened video. The encoded bytes stay owned by it, since FFmpeg reads
/// them while frames are decoded.
pub struct Capture {
    raw: *mut ffi::pw_video,
    info: StreamInfo,
    limits: VideoLimits,
    read: bool,
    pending: Option<PendingCount>,
    /// The decoder threads `raw` was opened with, for a fresh handle.
    threads: i32,
    /// Packets decoded by the handles `raw` replaced.
    packets_before: u64,
    /// How long the open took, and where the read's time went.
    open_time: Duration,
    times: Vec<PieceTimes>,
    // What the shim asks between packets (the stop flag, the decoding
    // budget, the turns); dropped after `raw` is closed (see Drop).
    pace: Arc<Pace>,
    // Dropped after `raw` is closed (see Drop); shared with the captures
    // that read pieces of the video.
    source: Arc<dyn AsRef<[u8]> + Send + Sync>,
}

// SAFETY: the shim's handle is only used through `&mut self` (and closed in
// Drop), so by one thread at a time; FFmpeg contexts may move between
// threads. `&self` reads only the Rust-side `info`.
unsafe impl Send for Capture {}
unsafe impl Sync for Capture {}

impl Drop for Capture {
    fn drop(&mut self) {
        // SAFETY: `raw` came from pw_video_open and is closed once.
        unsafe { ffi::pw_video_close(self.raw) };
    }
}

fn c_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A shim handle over `data` (which must outlive it, as `pace` must), its
/// headers read, paced by `pace` from then on.
fn open_raw(
    data: &[u8],
    threads: i32,
    limits: &VideoLimits,
    pace: &Pace,
) -> Result<*mut ffi::pw_video> {
    let stop = pace.stop_flag();
    super::sample_tables::check(data)?;
    let max_pixels = i64::try_from(limits.max_pixels).unwrap_or(i64::MAX);
    let mut raw = std::ptr::null_mut();
    let mut err = [0 as c_char; 256];
    let stop_ptr = stop.map_or(std::ptr::null(), |flag| flag.as_ptr().cast_const());
    // SAFETY: `data` and `stop` outlive the handle (they live in the
    // Capture, the handle is closed first); `err` is writable for its length.
    let code = unsafe {
        ffi::pw_video_open(
            data.as_ptr(),
            data.len(),
            threads,
            max_pixels,
            stop_ptr,
            &mut raw,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    // SAFETY: the shim always NUL-terminates inside `err`.
    let message = unsafe { CStr::from_ptr(err.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    if code != ffi::PW_OK && stop.is_some_and(|flag| flag.load(Ordering::Relaxed) != 0) {
        return Err(cancelled());
    }
    match code {
        ffi::PW_OK => {}
        ffi::PW_ERR_NO_DECODER => return Err(Error::UnsupportedVideo(message)),
        ffi::PW_ERR_TOO_LARGE => {
            let (w, h) = message
                .split_once('x')
                .and_then(|(w, h)| Some((w.parse().ok()?, h.parse().ok()?)))
                .unwrap_or((u32::MAX, u32::MAX));
            limits.check_frame_size(w, h)?;
            return Err(Error::Video(format!("video frames are {message}")));
        }
        ffi::PW_ERR_MEMORY => return Err(Error::Video("out of memory".into())),
        _ => return Err(Error::Video(message)),
    }
    pace.attach(raw);
    Ok(raw)
}

impl Capture {
    /// Opens `source` and reads its headers. `threads` is the decoder's
    /// thread count; 0 means OpenCV's default, min(cores, 16). `end_check`
    /// says when the frame count is settled. Once `stop` is set the work
    /// stops within a packet (`Cancelled`). With `client`, the decoding
    /// takes turns with the process's other decodes that name a client
    /// ([`DecodeTurns`](super::DecodeTurns)): at most its `calls` run at
    /// once, and the client that has had least goes first.
    pub fn open(
        source: Box<dyn AsRef<[u8]> + Send + Sync>,
        threads: usize,
        limits: VideoLimits,
        end_check: EndCheck,
        stop: Option<Arc<AtomicI32>>,
        client: Option<&str>,
    ) -> Result<Capture> {
        let data = (*source).as_ref();
        limits.check_encoded(data.len())?;
        if data.is_empty() {
            return Err(Error::Video("empty video data".into()));
        }
        let threads = i32::try_from(threads.min(1024)).unwrap_or(0);
        let pace = Pace::new(stop, client);
        let _turn = pace.turn()?;
        Capture::open_paced(Arc::from(source), threads, limits, end_check, pace.clone())
    }

    /// Another capture of the same bytes for a piece of this one's read,
    /// on `threads` decoder threads, its frame count this one's; it takes
    /// this one's turns and stop flag, and is held to its budget. The
    /// piece that reads to the end (`last`) also takes this one's
    /// provisional count, which its read confirms or settles.
    pub(super) fn open_piece(&self, threads: i32, last: bool) -> Result<Capture> {
        let count = EndCheck::Known(self.info.frame_count);
        let source = self.source.clone();
        let mut piece =
            Capture::open_paced(source, threads, self.limits, count, self.pace.clone())?;
        if last {
            piece.pending = self.pending;
            piece.info.frame_count_settled = self.info.frame_count_settled;
        }
        Ok(piece)
    }

    /// Takes what the read of its last piece found: the frame count, then
    /// settled (or the read failed), the packets its pieces decoded, and
    /// that this capture has been read.
    pub(super) fn adopt_pieces(&mut self, last: &Capture, packets: u64, times: Vec<PieceTimes>) {
        self.read = true;
        self.times = times;
        self.pending = None;
        self.info.frame_count = last.info.frame_count;
        self.info.frame_count_settled = true;
        self.packets_before += packets;
    }

    fn open_paced(
        source: Arc<dyn AsRef<[u8]> + Send + Sync>,
        threads: i32,
        limits: VideoLimits,
        end_check: EndCheck,
        pace: Arc<Pace>,
    ) -> Result<Capture> {
        let opened = Instant::now();
        let data = (*source).as_ref();
        let raw = open_raw(data, threads, &limits, &pace)?;
        let mut raw_info = std::mem::MaybeUninit::<ffi::pw_video_info>::zeroed();
        // SAFETY: `raw` is an open handle; the shim fills the whole struct.
        let raw_info = unsafe {
            ffi::pw_video_get_info(raw, raw_info.as_mut_ptr());
            raw_info.assume_init()
        };
        let info = StreamInfo {
            width: raw_info.width.max(0) as u32,
            height: raw_info.height.max(0) as u32,
            frame_count: raw_info.frame_count,
            header_frame_count: raw_info.frame_count,
            frame_count_settled: true,
            fps: raw_info.fps,
            duration: raw_info.duration_sec,
            rotation: raw_info.rotation,
            threads: raw_info.threads.max(0) as u32,
            codec: c_string(&raw_info.codec),
            pix_fmt: c_string(&raw_info.pix_fmt),
        };
        let mut capture = Capture {
            raw,
            info,
            limits,
            read: false,
            pending: None,
            threads,
            packets_before: 0,
            open_time: Duration::ZERO,
            times: Vec::new(),
            pace,
            source,
        };
        limits.check_frame_size(capture.info.width, capture.info.height)?;
        if capture.info.width == 0 || capture.info.height == 0 {
            return Err(Error::Video("the video stream has no frame size".into()));
        }
        capture.pace.set_budget(capture.packet_budget());
        // Before the seek to the end below, the first step that decodes.
        let info = &capture.info;
        limits.check_seconds(info.duration, info.header_frame_count, info.fps)?;
        if capture.info.rotation % 180 != 0 {
            let info = &mut capture.info;
            std::mem::swap(&mut info.width, &mut info.height);
        }
        match end_check {
            EndCheck::AtOpen => {
                // SAFETY: `raw` is an open handle, used by this thread only.
                capture.info.frame_count = unsafe { ffi::pw_video_presentable_frames(capture.raw) };
            }
            EndCheck::SharedWithRead => {
                let mut end = ffi::pw_video_end::default();
                // SAFETY: as above; the shim fills `end`.
                let deferred =
                    unsafe { ffi::pw_video_presentable_frames_deferred(capture.raw, &mut end) };
                capture.info.frame_count = end.frame_count;
                if deferred != 0 {
                    capture.info.frame_count_settled = false;
                    capture.pending = Some(PendingCount {
                        landing_pts: end.landing_pts,
                        landing_number: end.landing_number,
                    });
                }
            }
            EndCheck::Known(count) => capture.info.frame_count = count,
        }
        capture.check_stopped()?;
        capture.open_time = opened.elapsed();
        Ok(capture)
    }

    pub fn info(&self) -> &StreamInfo {
        &self.info
    }

    /// [`cancelled`] once the stop flag stopped the shim's work, a
    /// `max_decode_pixels` refusal once the decoding budget did: what it
    /// counted or grabbed since is not the video's.
    fn check_stopped(&self) -> Result<()> {
        // SAFETY: `raw` is an open handle.
        if unsafe { ffi::pw_video_stopped(self.raw) } != 0 {
            if self.pace.over_budget() {
                let packets = u64::try_from(unsafe { ffi::pw_video_packets_decoded(self.raw) });
                self.limits
                    .check_decode(packets.unwrap_or(u64::MAX), self.coded_pixels())?;
            }
            return Err(cancelled());
        }
        Ok(())
    }

    fn coded_pixels(&self) -> u64 {
        u64::from(self.info.width) * u64::from(self.info.height)
    }

    /// Packets one handle may decode: each of its two passes (the frame
    /// count's check at the end of the stream, the read) may decode
    /// `max_decode_pixels` worth of frames once.
    fn packet_budget(&self) -> i64 {
        let frames = self.limits.max_decode_pixels / self.coded_pixels().max(1);
        i64::try_from(frames.saturating_mul(2)).unwrap_or(i64::MAX)
    }

    /// The pieces a read of `wanted` would be split into (one: not split),
    /// before the read.
    pub fn read_plan(&mut self, wanted: &[usize]) -> Vec<Vec<usize>> {
        match pieces::plan(self, wanted) {
            Some(plan) => plan.pieces,
            None => {
                let mut all = wanted.to_vec();
                all.sort_unstable();
                all.dedup();
                vec![all]
            }
        }
    }

    /// Where its read's time went, piece by piece (empty before a read).
    pub fn piece_times(&self) -> &[PieceTimes] {
        &self.times
    }

    /// The flag that stops this capture's work.
    pub(super) fn stop_flag(&self) -> Option<Arc<AtomicI32>> {
        self.pace.stop_flag().cloned()
    }

    /// Packets given to the decoder since open (the end-of-stream check's
    /// and any read's, its pieces' included).
    pub fn packets_decoded(&self) -> u64 {
        // SAFETY: `raw` is an open handle.
        let n = unsafe { ffi::pw_video_packets_decoded(self.raw) };
        self.packets_before + u64::try_from(n).unwrap_or(0)
    }

    /// Bytes of one returned (RGB, rotated) frame, at its size after
    /// `resize` if there is one.
    pub fn frame_bytes(&self, resize: Option<&Target>) -> usize {
        match resize {
            Some(target) => target.height * target.width * 3,
            None => self.info.width as usize * self.info.height as usize * 3,
        }
    }

    /// Bytes the frames of `wanted` take at most (repeats count once), at
    /// their size after `resize` (a resized frame is decoded into a scratch
    /// frame first: one, whatever the count), checked against the limits
    /// before any of that memory exists.
    pub fn sampled_bytes(&self, wanted: &[usize], resize: Option<&Target>) -> Result<usize> {
        let count = wanted.iter().collect::<BTreeSet<_>>().len();
        if let Some(&last) = wanted.iter().max() {
            // Decoding stops at the stream's end: no more frames than the
            // headers count (a count they understate runs into the budget
            // the decoder is held to as it goes).
            let through = last as u64 + 1;
            let frames = match u64::try_from(self.info.frame_count) {
                Ok(count) if count > 0 => through.min(count),
                _ => through,
            };
            self.limits.check_decode(frames, self.coded_pixels())?;
        }
        let frame_bytes = self.frame_bytes(resize);
        self.limits.check_sampled(count, frame_bytes as u64)?;
        Ok(count * frame_bytes)
    }

    /// Decodes from the start up to the last wanted index and keeps the
    /// wanted frames, as vLLM's `_read_frames_no_recovery`: a frame that does
    /// not decode is skipped (its index is missing from the result), indices
    /// come back sorted and without repeats. Limits are checked before the
    /// output exists; decoding stops early once the stream has ended. Only
    /// the wanted frames are converted to RGB, and H.264 and HEVC frames that no
    /// frame refers to are not decoded unless wanted (the shim's skipper;
    /// it numbers frames as OpenCV does or gives up, and then every frame
    /// is read again). Each frame is resized to `resize` (with that
    /// processor arithmetic) when given. A capture reads once.
    pub fn read_frames(
        &mut self,
        wanted: &[usize],
        conversion: Conversion,
        resize: Option<&Target>,
    ) -> Result<Frames> {
        let len = self.sampled_bytes(wanted, resize)?;
        let mut pixels = Vec::new();
        pixels
            .try_reserve_exact(len)
            .map_err(|_| Error::Video("out of memory for the sampled frames".into()))?;
        pixels.resize(len, 0);
        let indices = self.read_frames_into(wanted, conversion, resize, &mut pixels)?;
        pixels.truncate(indices.len() * self.frame_bytes(resize));
        let (height, width) = match resize {
            Some(target) => (target.height, target.width),
            None => (self.info.height as usize, self.info.width as usize),
        };
        Ok(Frames {
            pixels,
            indices,
            height,
            width,
            packets_decoded: self.packets_decoded(),
            times: self.times.clone(),
        })
    }

    /// [`Capture::read_frames`] into `out` (at least
    /// [`Capture::sampled_bytes`] long), each frame resized to `resize`
    /// (with that processor arithmetic) when given: the frames are packed
    /// at its start, in index order, and their indices returned. Bytes
    /// past them are left as they were.
    pub fn read_frames_into(
        &mut self,
        wanted: &[usize],
        conversion: Conversion,
        resize: Option<&Target>,
        out: &mut [u8],
    ) -> Result<Vec<usize>> {
        let flag = self.pace.stop_flag().cloned();
        let stopped = move || {
            flag.as_ref()
                .filter(|flag| flag.load(Ordering::Relaxed) != 0)
                .map(|_| cancelled())
        };
        self.read_frames_until(wanted, conversion, resize, out, &stopped)
    }

    /// [`Capture::read_frames_into`] that asks `stop` before each frame it
    /// decodes and fails with its error once it gives one (its caller went
    /// away): a video sampled near its end is not decoded to the end for
    /// nobody.
    pub fn read_frames_until(
        &mut self,
        wanted: &[usize],
        conversion: Conversion,
        resize: Option<&Target>,
        out: &mut [u8],
        stop: &dyn Fn() -> Option<Error>,
    ) -> Result<Vec<usize>> {
        let _turn = self.pace.turn()?;
        let format = FrameFormat { conversion, resize };
        match pieces::plan(self, wanted) {
            Some(plan) => pieces::read(self, &plan, format, out, stop),
            None => self.read_in_turn(wanted, format, out, stop),
        }
    }

    /// The frames of sequences that begin at `starts`, where decoding may
    /// start afresh and give the same frames (H.264 and HEVC streams the
    /// skipper numbers); None for other streams, and once read.
    pub(super) fn sequence_starts(&mut self) -> Option<Vec<usize>> {
        if self.read {
            return None;
        }
        let mut starts = vec![0i64; MAX_SEQUENCES];
        // SAFETY: `raw` is an open handle at the start of the stream (no
        // read yet), used by this thread only; `starts` has room for its length.
        let n =
            unsafe { ffi::pw_video_sequence_starts(self.raw, starts.as_mut_ptr(), starts.len()) };
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n > 0 && n <= starts.len())?;
        starts.truncate(n);
        starts
            .into_iter()
            .map(|s| usize::try_from(s).ok())
            .collect()
    }

    /// [`Capture::read_frames_until`] within a turn already held (by this
    /// capture, or by the one whose read this capture's is a piece of).
    pub(super) fn read_in_turn(
        &mut self,
        wanted: &[usize],
        format: FrameFormat<'_>,
        out: &mut [u8],
        stop: &dyn Fn() -> Option<Error>,
    ) -> Result<Vec<usize>> {
        let FrameFormat { conversion, resize } = format;
        if self.read {
            return Err(Error::InvalidArgument(
                "a video capture reads its frames once".into(),
            ));
        }
        let need = self.sampled_bytes(wanted, resize)?;
        if out.len() < need {
            return Err(Error::InvalidArgument(format!(
                "{} bytes given for {need} bytes of frames",
                out.len()
            )));
        }
        self.read = true;
        let started = Instant::now();
        let wanted: BTreeSet<usize> = wanted.iter().copied().collect();
        let count = self.info.frame_count;
        if let (Some(pending), Some(&last)) = (self.pending, wanted.last()) {
            if (last as i64) < pending.landing_number {
                // The read stops before the landing: decoding from it to the
                // end would be work the read does not share.
                self.settle()?;
            }
        }
        let (width, height) = (self.info.width as usize, self.info.height as usize);
        // The stream's own (unrotated) size, which the shim writes.
        let coded = if self.info.rotation % 180 != 0 {
            (width, height)
        } else {
            (height, width)
        };
        let mut output = Output {
            pixels: out,
            indices: Vec::with_capacity(wanted.len()),
            retrieved: Vec::new(),
            rotated: Vec::new(),
            size: (height, width),
            out_frame_bytes: self.frame_bytes(resize),
            rotation: applied_rotation(self.info.rotation),
            coded,
            conversion,
            resize: resize.copied(),
            failed: None,
            stop,
            convert: Duration::ZERO,
            first: None,
        };
        let mut track = self.pending.map(|p| EndTrack::new(p.landing_pts));
        if let Some(&last) = wanted.last() {
            // A provisional count is confirmed by reading on to its last frame.
            let through = match self.pending {
                Some(_) => last.max(usize::try_from(count - 1).unwrap_or(last)),
                None => last,
            };
            match self.read_skipping(&wanted, through, &mut output, track.as_mut()) {
                Skipping::Done => {}
                Skipping::Off => self.read_every(&wanted, through, &mut output, track.as_mut()),
                Skipping::Failed => {
                    // Every frame again, from a decoder that has decoded
                    // what OpenCV's has when its read starts.
                    output.indices.clear();
                    track = None;
                    self.pending = None;
                    self.settle_afresh()?;
                    self.read_every(&wanted, last, &mut output, None);
                }
            }
        }
        if let Some(error) = output.failed {
            return Err(error);
        }
        self.check_stopped()?;
        let read = started.elapsed();
        if let Some(pending) = self.pending {
            if track.is_some_and(|t| t.confirms(&pending, count)) {
                self.pending = None;
                self.info.frame_count_settled = true;
            } else {
                self.settle()?;
            }
        }
        self.times = vec![PieceTimes {
            frames: output.indices.len(),
            threads: self.info.threads,
            packets: self.packets_decoded(),
            open: self.open_time,
            first_frame: output.first.map_or(Duration::ZERO, |at| at - started),
            decode: read.saturating_sub(output.convert),
            convert: output.convert,
        }];
        Ok(output.indices)
    }

    /// Settles a provisional frame count as OpenCV's check does (decoding
    /// the end of the stream), back at the start: an error when it is not
    /// the count the frames were sampled over.
    fn settle(&mut self) -> Result<()> {
        if self.pending.take().is_none() {
            return Ok(());
        }
        self.settle_afresh()
    }

    /// A fresh handle in place of `raw`, its frame count settled as
    /// OpenCV settles it at open, so that its decoder holds what OpenCV's
    /// holds when its read starts (a damaged stream's pictures can depend
    /// on what was decoded before them): an error when the count is not
    /// the one the frames were sampled over.
    fn settle_afresh(&mut self) -> Result<()> {
        let data = (*self.source).as_ref();
        let raw = open_raw(data, self.threads, &self.limits, &self.pace)?;
        // SAFETY: `self.raw` and `raw` are open handles, used by this
        // thread only; the old one is closed once, and `raw` replaces it.
        let count = unsafe {
            self.packets_before +=
                u64::try_from(ffi::pw_video_packets_decoded(self.raw)).unwrap_or(0);
            ffi::pw_video_close(self.raw);
            self.raw = raw;
            ffi::pw_video_presentable_frames(self.raw)
        };
        self.check_stopped()?;
        self.info.frame_count_settled = true;
        let sampled = std::mem::replace(&mut self.info.frame_count, count);
        if count != sampled {
            return Err(Error::VideoFrameCountChanged(format!(
                "the video has {count} frames as OpenCV counts them, not the {sampled} \
                 it was sampled over"
            )));
        }
        Ok(())
    }

    /// OpenCV's read: one grab per frame number up to `last`, a frame that
    /// does not decode taking its number with it.
    fn read_every(
        &mut self,
        wanted: &BTreeSet<usize>,
        last: usize,
        out: &mut Output<'_>,
        mut track: Option<&mut EndTrack>,
    ) {
        for index in 0..=last {
            if out.stopped() {
                return;
            }
            // SAFETY: `raw` is an open handle, used by this thread only.
            if unsafe { ffi::pw_video_grab(self.raw) } == 0 {
                if unsafe { ffi::pw_video_finished(self.raw) } != 0 {
                    break;
                }
                if let Some(track) = track.as_deref_mut() {
                    track.missed();
                }
                continue;
            }
            if let Some(track) = track.as_deref_mut() {
                // SAFETY: as above.
                track.grabbed(index, unsafe { ffi::pw_video_frame_pts(self.raw) });
            }
            if wanted.contains(&index) {
                out.keep(self.raw, index);
            }
        }
    }

    /// The same frames with the shim skipping (H.264, HEVC) frames that nothing
    /// sampled refers to, numbered by the shim: `Off` where it does not
    /// skip (other codecs), `Failed` once it cannot vouch for its numbering
    /// (the caller then reads every frame, from a fresh handle).
    fn read_skipping(
        &mut self,
        wanted: &BTreeSet<usize>,
        last: usize,
        out: &mut Output<'_>,
        mut track: Option<&mut EndTrack>,
    ) -> Skipping {
        let numbers: Vec<i64> = wanted.iter().map(|&i| i as i64).collect();
        // Frames from the landing of the seek to the end on are all decoded
        // while the count is pending: the read confirms it by them.
        let decode_from = self.pending.map_or(i64::MAX, |p| p.landing_number);
        // SAFETY: `raw` is an open handle; the shim copies `numbers`.
        let on = unsafe {
            ffi::pw_video_skip_unwanted(
                self.raw,
                numbers.as_ptr(),
                numbers.len(),
                last as i64,
                decode_from,
            )
        };
        if on == 0 {
            return Skipping::Off;
        }
        loop {
            if out.stopped() {
                return Skipping::Done;
            }
            // SAFETY: as above.
            let grabbed = unsafe { ffi::pw_video_grab(self.raw) } != 0;
            if unsafe { ffi::pw_video_skip_failed(self.raw) } != 0 {
                return Skipping::Failed;
            }
            if !grabbed {
                // The shim fails its numbering on a frame that does not
                // decode, so this is the end of the stream.
                return Skipping::Done;
            }
            let index = unsafe { ffi::pw_video_frame_index(self.raw) };
            let Ok(index) = usize::try_from(index) else {
                return Skipping::Failed;
            };
            if let Some(track) = track.as_deref_mut() {
                // SAFETY: as above.
                track.grabbed(index, unsafe { ffi::pw_video_frame_pts(self.raw) });
            }
            if wanted.contains(&index) {
                out.keep(self.raw, index);
            }
            if index >= last {
                return Skipping::Done;
            }
        }
    }
}

enum Skipping {
    Off,
    Done,
    Failed,
}

/// Where sampled frames go as they are read.
struct Output<'a> {
    pixels: &'a mut [u8],
    indices: Vec<usize>,
    /// The frame as the shim writes it, and rotated, when the output
    /// cannot take it directly.
    retrieved: Vec<u8>,
    rotated: Vec<u8>,
    /// The returned (rotated) height and width before any resize.
    size: (usize, usize),
    out_frame_bytes: usize,
    rotation: Option<i32>,
    /// The stream's own (unrotated) height and width, which the shim writes.
    coded: (usize, usize),
    conversion: Conversion,
    resize: Option<Target>,
    /// The first error a frame met (a resize, or the caller's stop); no
    /// frame is kept after it.
    failed: Option<Error>,
    /// Asked before each frame is decoded: an error ends the read.
    stop: &'a dyn Fn() -> Option<Error>,
    /// Time spent converting kept frames, and when the first was kept.
    convert: Duration,
    first: Option<Instant>,
}

impl Output<'_> {
    /// Whether the read must end now: a frame failed, or the caller's
    /// `stop` gave its error (kept as the read's).
    fn stopped(&mut self) -> bool {
        if self.failed.is_none() {
            self.failed = (self.stop)();
        }
        self.failed.is_some()
    }

    /// Converts the frame just grabbed (rotated, resized) into the next
    /// free place, timed.
    fn keep(&mut self, raw: *mut ffi::pw_video, index: usize) {
        let started = Instant::now();
        self.first.get_or_insert(started);
        self.convert_frame(raw, index);
        self.convert += started.elapsed();
    }

    fn convert_frame(&mut self, raw: *mut ffi::pw_video, index: usize) {
        if self.failed.is_some() {
            return;
        }
        let (height, width) = self.size;
        let frame_bytes = height * width * 3;
        let at = self.indices.len() * self.out_frame_bytes;
        let direct = self.rotation.is_none() && self.resize.is_none();
        if !direct && self.retrieved.is_empty() {
            self.retrieved.resize(frame_bytes, 0);
        }
        let dst = if direct {
            self.pixels[at..at + frame_bytes].as_mut_ptr()
        } else {
            self.retrieved.as_mut_ptr()
        };
        // SAFETY: `dst` has room for width * height * 3 bytes, the size the
        // shim writes (the stream's coded size); `raw` is open and used by
        // this thread only.
        let ok = unsafe {
            match self.conversion {
                Conversion::BgrSwapped => ffi::pw_video_retrieve(raw, dst),
                Conversion::RgbDirect => ffi::pw_video_retrieve_rgb_direct(raw, dst),
            }
        };
        if ok == 0 {
            return;
        }
        let frame_out = &mut self.pixels[at..at + self.out_frame_bytes];
        let upright: &[u8] = match (self.rotation, self.resize) {
            (Some(degrees), None) => {
                let (coded_height, coded_width) = self.coded;
                rotate(
                    &self.retrieved,
                    coded_height,
                    coded_width,
                    degrees,
                    frame_out,
                );
                &[]
            }
            (Some(degrees), Some(_)) => {
                let (coded_height, coded_width) = self.coded;
                self.rotated.resize(frame_bytes, 0);
                rotate(
                    &self.retrieved,
                    coded_height,
                    coded_width,
                    degrees,
                    &mut self.rotated,
                );
                &self.rotated
            }
            (None, _) => &self.retrieved,
        };
        if let Some(target) = self.resize {
            let resized = target.resize_into(upright, (height, width), 3, frame_out);
            if let Err(error) = resized {
                self.failed = Some(error);
                return;
            }
        }
        self.indices.push(index);
    }
}

#[cfg(test)]
mod tests {
    use super::{ffi, rotate};

    /// A 2x3 frame whose pixels are numbered, rotated as `np.rot90(k=-1)`
    /// (clockwise), `k=2` and `k=1` would rotate it.
    #[test]
    fn rotations_match_cv_rotate() {
        let src: Vec<u8> = (0..6u8).flat_map(|p| [p, p, p]).collect();
        let turned = |degrees| {
            let mut dst = vec![0; 18];
            rotate(&src, 2, 3, degrees, &mut dst);
            dst.chunks(3).map(|p| p[0]).collect::<Vec<_>>()
        };
        // [[0 1 2] [3 4 5]] clockwise: [[3 0] [4 1] [5 2]].
        assert_eq!(turned(90), [3, 0, 4, 1, 5, 2]);
        assert_eq!(turned(180), [5, 4, 3, 2, 1, 0]);
        assert_eq!(turned(270), [2, 5, 1, 4, 0, 3]);
    }

    /// The shim's reading of an HEVC PPS, which decides whether HEVC frames
    /// may be skipped: a picture withheld from output (pic_output_flag)
    /// must not be counted as a frame OpenCV numbers.
    #[test]
    fn hevc_pps_output_flag_is_read_past_two_exp_golomb_fields_and_emulation_prevention() {
        let read =
            |nal: &[u8]| unsafe { ffi::pw_hevc_pps_output_flag_present(nal.as_ptr(), nal.len()) };
        // NAL header (type 34), then pps_id ue(0) = 1, sps_id ue(0) = 1,
        // dependent_slice_segments_enabled_flag, output_flag_present_flag.
        assert_eq!(read(&[0x44, 0x01, 0b1101_0000]), 1);
        assert_eq!(read(&[0x44, 0x01, 0b1100_0000]), 0);
        assert_eq!(read(&[0x44, 0x01, 0b1110_0000]), 0);
        // pps_id ue(2^23 - 1): 23 zero bits, a one, 23 zero bits, so its
        // bytes need emulation prevention (00 00 03 01, twice); then
        // sps_id 1, dependent slices 0, output flag 1.
        assert_eq!(
            read(&[0x44, 0x01, 0x00, 0x00, 0x03, 0x01, 0x00, 0x00, 0x03, 0x01, 0x40]),
            1
        );
        // Over 31 leading zero bits: no Exp-Golomb field pixelwire reads.
        assert_eq!(
            read(&[0x44, 0x01, 0x00, 0x00, 0x03, 0x00, 0x00, 0x03, 0x00]),
            -1
        );
        // Cut short: unreadable.
        assert_eq!(read(&[0x44, 0x01]), -1);
        assert_eq!(read(&[0x44, 0x01, 0b1000_0000]), -1);
    }

    /// The shim's reading of a VP9 frame header, which decides whether the
    /// end-of-stream count may be shared with the read: only a shown key
    /// frame resets everything a later frame could refer to.
    #[test]
    fn vp9_shown_key_frames_are_read_in_every_profile_and_nothing_else() {
        let read = |p: &[u8]| unsafe { ffi::pw_vp9_shown_key_frame(p.as_ptr(), p.len()) };
        let sync = [0x49, 0x83, 0x42, 0x00];
        // Profile 0: frame_marker 2, profile bits 0 0, show_existing_frame
        // 0, frame_type 0 (key), show_frame 1, error_resilient_mode 0.
        assert_eq!(read(&[&[0b1000_0010][..], &sync].concat()), 1);
        // Profile 1 (low bit set) and 2 (high bit set).
        assert_eq!(read(&[&[0b1010_0010][..], &sync].concat()), 1);
        assert_eq!(read(&[&[0b1001_0010][..], &sync].concat()), 1);
        // An inter frame, a hidden key frame, a shown existing frame.
        assert_eq!(read(&[&[0b1000_0110][..], &sync].concat()), 0);
        assert_eq!(read(&[&[0b1000_0000][..], &sync].concat()), 0);
        assert_eq!(read(&[&[0b1000_1010][..], &sync].concat()), 0);
        // A wrong frame marker, a wrong sync code, too short.
        assert_eq!(read(&[&[0b0100_0010][..], &sync].concat()), 0);
        assert_eq!(read(&[0b1000_0010, 0x49, 0x83, 0x43, 0x00]), 0);
        assert_eq!(read(&[0b1000_0010, 0x49, 0x83, 0x42]), 0);
        // Profile 3: a reserved zero bit moves the rest one bit on, so
        // error_resilient_mode is the second byte's first bit and the sync
        // code starts at its second.
        assert_eq!(read(&[0b1011_0001, 0x24, 0xc1, 0xa1, 0x00]), 1);
        assert_eq!(read(&[0b1011_1001, 0x24, 0xc1, 0xa1, 0x00]), 0);
        assert_eq!(read(&[0b1011_0011, 0x24, 0xc1, 0xa1, 0x00]), 0);
    }
}
