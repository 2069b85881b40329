//! Native image decoding with the exact semantics of vLLM's Pillow loader.
//!
//! Every format decoder first reads only the header ([`probe`]), so limits are
//! enforced before any pixel buffer exists, then decodes straight into a
//! caller-provided buffer ([`decode_into`]) when the source layout already is
//! the requested mode, or through one scratch raster and a Pillow-exact
//! conversion otherwise.

mod batch;
pub use batch::{decode_many, thread_count, thread_pool, Decoded};
mod convert;
pub use convert::expand_rgb_to_rgbx;
mod fresh;
#[cfg(any(test, fuzzing))]
pub use fresh::poison;
pub(crate) use fresh::Fresh;
mod generic;
mod gif;
mod jpeg;
mod orient;
mod png;
pub mod recycle;
mod webp;

pub use convert::Raster;

use crate::errors::{Error, Result};

/// Output pixel layout, named as Pillow names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    L,
    Rgb,
    Rgba,
}

impl Mode {
    pub fn channels(self) -> usize {
        match self {
            Mode::L => 1,
            Mode::Rgb => 3,
            Mode::Rgba => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::L => "L",
            Mode::Rgb => "RGB",
            Mode::Rgba => "RGBA",
        }
    }

    pub fn parse(name: &str) -> Result<Mode> {
        match name {
            "L" => Ok(Mode::L),
            "RGB" => Ok(Mode::Rgb),
            "RGBA" => Ok(Mode::Rgba),
            other => Err(Error::InvalidArgument(format!(
                "mode must be 'RGB', 'RGBA' or 'L', not {other:?}"
            ))),
        }
    }

    pub fn from_channels(channels: usize) -> Option<Mode> {
        match channels {
            1 => Some(Mode::L),
            3 => Some(Mode::Rgb),
            4 => Some(Mode::Rgba),
            _ => None,
        }
    }
}

/// Resource limits, checked against the encoded size and the header before
/// any pixel memory is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: usize,
    pub max_pixels: u64,
    pub max_side: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 50 * 1024 * 1024,
            max_pixels: 50_000_000,
            max_side: 20_000,
        }
    }
}

impl Limits {
    pub fn check_encoded(&self, len: usize) -> Result<()> {
        if len > self.max_bytes {
            return Err(Error::OverLimit {
                message: format!(
                    "encoded image is {len} bytes, over the limit of {} bytes",
                    self.max_bytes
                ),
                setting: "max_bytes",
                limit: self.max_bytes as u64,
                actual: len as u64,
            });
        }
        Ok(())
    }

    pub fn check_dimensions(&self, format: Format, width: u64, height: u64) -> Result<()> {
        let name = format.name();
        if width == 0 || height == 0 {
            return Err(Error::decode(format!(
                "{name} image has a zero dimension ({width}x{height})"
            )));
        }
        let side = width.max(height);
        if side > u64::from(self.max_side) {
            return Err(Error::OverLimit {
                message: format!(
                    "{name} image is {width}x{height}: side {side} px is over the limit of {} px",
                    self.max_side
                ),
                setting: "max_side",
                limit: u64::from(self.max_side),
                actual: side,
            });
        }
        let pixels = width * height;
        if pixels > self.max_pixels {
            return Err(Error::OverLimit {
                message: format!(
                    "{name} image is {width}x{height} = {pixels} pixels, over the limit of {} pixels",
                    self.max_pixels
                ),
                setting: "max_pixels",
                limit: self.max_pixels,
                actual: pixels,
            });
        }
        Ok(())
    }

    /// Bytes a decoder may allocate for scratch: the largest raster the pixel
    /// limit allows at 8 bytes a pixel (16-bit RGBA), plus slack.
    pub fn scratch_bytes(&self) -> u64 {
        self.max_pixels.saturating_mul(8).saturating_add(1 << 20)
    }
}

/// Container formats pixelwire decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Jpeg,
    Png,
    Gif,
    WebP,
    Bmp,
    Tiff,
    Ico,
    Tga,
    Pnm,
    Qoi,
}

impl Format {
    /// The name Pillow gives the format (`Image.format`).
    pub fn name(self) -> &'static str {
        match self {
            Format::Jpeg => "JPEG",
            Format::Png => "PNG",
            Format::Gif => "GIF",
            Format::WebP => "WEBP",
            Format::Bmp => "BMP",
            Format::Tiff => "TIFF",
            Format::Ico => "ICO",
            Format::Tga => "TGA",
            Format::Pnm => "PPM",
            Format::Qoi => "QOI",
        }
    }
}

/// What the header says, before any pixel is decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub format: Format,
    /// Stored width and height (before any EXIF orientation).
    pub width: u32,
    pub height: u32,
    /// The source's Pillow mode ("RGB", "P", "I;16", "CMYK", ...).
    pub color_type: &'static str,
    /// EXIF orientation tag (1..=8), 1 when absent.
    pub orientation: u8,
}

/// Everything that shapes the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeOptions {
    pub mode: Mode,
    /// Colour an RGBA source is composited onto when RGB is asked for.
    pub background: [u8; 3],
    pub limits: Limits,
    pub apply_exif_orientation: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            mode: Mode::Rgb,
            background: [255, 255, 255],
            limits: Limits::default(),
            apply_exif_orientation: false,
        }
    }
}

/// Output geometry for an image decoded with `opts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputShape {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

impl OutputShape {
    pub fn len(&self) -> usize {
        self.height * self.width * self.channels
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl ImageInfo {
    pub fn output_shape(&self, opts: &DecodeOptions) -> OutputShape {
        let (w, h) = if opts.apply_exif_orientation && orient::swaps_axes(self.orientation) {
            (self.height, self.width)
        } else {
            (self.width, self.height)
        };
        OutputShape {
            height: h as usize,
            width: w as usize,
            channels: opts.mode.channels(),
        }
    }
}

/// Identifies the format from its magic bytes.
pub fn sniff(data: &[u8]) -> Result<Format> {
    if data.is_empty() {
        return Err(Error::UnsupportedFormat(
            "empty input: 0 bytes is not an image".into(),
        ));
    }
    let starts = |magic: &[u8]| data.starts_with(magic);
    let format = if starts(&[0xFF, 0xD8, 0xFF]) {
        Format::Jpeg
    } else if starts(b"\x89PNG\r\n\x1a\n") {
        Format::Png
    } else if starts(b"GIF87a") || starts(b"GIF89a") {
        Format::Gif
    } else if data.len() >= 12 && starts(b"RIFF") && &data[8..12] == b"WEBP" {
        Format::WebP
    } else if starts(b"BM") {
        Format::Bmp
    } else if starts(b"II*\0") || starts(b"MM\0*") || starts(b"II+\0") || starts(b"MM\0+") {
        Format::Tiff
    } else if starts(&[0, 0, 1, 0]) {
        Format::Ico
    } else if starts(b"qoif") {
        Format::Qoi
    } else if data.len() >= 2 && data[0] == b'P' && (b'1'..=b'6').contains(&data[1]) {
        Format::Pnm
    } else if generic::looks_like_tga(data) {
        Format::Tga
    } else {
        let head: String = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(Error::UnsupportedFormat(format!(
            "unrecognised image format (first bytes {head}); pixelwire decodes JPEG, PNG, GIF, WebP, BMP, TIFF, ICO, TGA, PNM and QOI"
        )));
    };
    Ok(format)
}

/// Reads the header only and checks the limits. Allocates no pixel memory.
pub fn probe(data: &[u8], limits: &Limits) -> Result<ImageInfo> {
    limits.check_encoded(data.len())?;
    let format = sniff(data)?;
    let info = guard(format, || match format {
        Format::Jpeg => jpeg::probe(data, limits),
        Format::Png => png::probe(data, limits),
        Format::Gif => gif::probe(data, limits),
        Format::WebP => webp::probe(data, limits),
        _ => generic::probe(format, data, limits),
    })?;
    limits.check_dimensions(format, info.width.into(), info.height.into())?;
    Ok(info)
}

/// Decodes into `out`, which must be exactly `info.output_shape(opts).len()`
/// bytes. `info` must come from [`probe`] on the same `data`.
pub fn decode_into(
    data: &[u8],
    info: &ImageInfo,
    opts: &DecodeOptions,
    out: &mut [u8],
) -> Result<()> {
    let shape = info.output_shape(opts);
    if out.len() != shape.len() {
        return Err(Error::InvalidArgument(format!(
            "output buffer is {} bytes, the image needs {}",
            out.len(),
            shape.len()
        )));
    }
    let transform = opts.apply_exif_orientation && info.orientation != 1;
    guard(info.format, || {
        if transform {
            let stored = decode_stored(data, info, opts)?;
            orient::apply(
                info.orientation,
                &stored,
                info.width as usize,
                info.height as usize,
                shape.channels,
                out,
            );
            Ok(())
        } else {
            decode_to(data, info, opts, out)
        }
    })
}

/// Decodes the image as stored (no orientation applied) into `out`.
fn decode_to(data: &[u8], info: &ImageInfo, opts: &DecodeOptions, out: &mut [u8]) -> Result<()> {
    let target = Target {
        mode: opts.mode,
        background: opts.background,
    };
    match info.format {
        Format::Jpeg => jpeg::decode(data, info, &opts.limits, target, out),
        Format::Png => png::decode(data, info, &opts.limits, target, out),
        Format::Gif => gif::decode(data, info, &opts.limits, target, out),
        Format::WebP => webp::decode(data, info, &opts.limits, target, out),
        _ => generic::decode(data, info, &opts.limits, target, out),
    }
}

/// The image as stored (no orientation applied), in a new buffer. JPEG and
/// still WebP in the layouts their C decoders write themselves skip the
/// zero-fill (see `fresh`); the Rust decoders write through `&mut [u8]`, so
/// their buffers stay zero-initialised.
fn decode_stored(data: &[u8], info: &ImageInfo, opts: &DecodeOptions) -> Result<Vec<u8>> {
    let target = Target {
        mode: opts.mode,
        background: opts.background,
    };
    let len = info.width as usize * info.height as usize * opts.mode.channels();
    let direct = match info.format {
        Format::Jpeg => jpeg::decode_fresh(data, info, &opts.limits, target)?,
        Format::WebP => webp::decode_fresh(data, info, &opts.limits, target)?,
        _ => None,
    };
    if let Some(pixels) = direct {
        if pixels.len() != len {
            return Err(Error::decode(format!(
                "{}: decoded {} bytes where the header promises {len}",
                info.format.name(),
                pixels.len()
            )));
        }
        return Ok(pixels);
    }
    // Zero-filled: these decoders are not shown to write every byte.
    let mut out = fresh::Fresh::new(len).zeroed();
    decode_to(data, info, opts, &mut out)?;
    Ok(out)
}

/// Decodes into a new buffer at `resize`'s size (or the oriented size
/// without one); `info` must come from [`probe`] on the same `data`. Like
/// [`decode_resized_into`], but the full-size output of JPEG and still WebP
/// is not zero-filled first.
pub fn decode_resized(
    data: &[u8],
    info: &ImageInfo,
    opts: &DecodeOptions,
    resize: Option<&crate::resize::Target>,
) -> Result<Vec<u8>> {
    let shape = info.output_shape(opts);
    if resize.is_some_and(|t| t.changes((shape.height, shape.width))) {
        // Resized outputs are model-input sized, written by Rust code through
        // `&mut [u8]`: zero-initialised.
        let mut out = fresh::Fresh::new(resized_shape(shape, resize).len()).zeroed();
        decode_resized_into(data, info, opts, resize, &mut out)?;
        return Ok(out);
    }
    guard(info.format, || {
        let stored = decode_stored(data, info, opts)?;
        if !(opts.apply_exif_orientation && info.orientation != 1) {
            return Ok(stored);
        }
        let mut upright = fresh::Fresh::new(stored.len());
        orient::apply_uninit(
            info.orientation,
            &stored,
            info.width as usize,
            info.height as usize,
            shape.channels,
            upright.as_uninit(),
        );
        // SAFETY: `apply_uninit` writes every byte of its output.
        Ok(unsafe { upright.assume_filled() })
    })
}

/// Past this, a thread's full-size scratch is given back after each use
/// rather than kept for the next image.
const KEEP_SCRATCH: usize = 64 << 20;

thread_local! {
    /// Full-size pixels of an image about to be resized, per thread: grown
    /// to the largest image seen (up to [`KEEP_SCRATCH`]), never zeroed again.
    static FULL_SIZE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Decodes into `out` at `resize`'s size: the full-size pixels go to a
/// per-thread scratch buffer, then are resized into `out`. Without a
/// resize, or at the decoded size already, decodes straight into `out`.
pub fn decode_resized_into(
    data: &[u8],
    info: &ImageInfo,
    opts: &DecodeOptions,
    resize: Option<&crate::resize::Target>,
    out: &mut [u8],
) -> Result<()> {
    let shape = info.output_shape(opts);
    let Some(target) = resize.filter(|t| t.changes((shape.height, shape.width))) else {
        return decode_into(data, info, opts, out);
    };
    FULL_SIZE.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < shape.len() {
            scratch.resize(shape.len(), 0);
        }
        let full = &mut scratch[..shape.len()];
        let outcome = decode_into(data, info, opts, full).and_then(|()| {
            target.resize_into(full, (shape.height, shape.width), shape.channels, out)
        });
        if scratch.len() > KEEP_SCRATCH {
            *scratch = Vec::new();
        }
        outcome
    })
}

/// The output shape with `resize` applied.
pub fn resized_shape(shape: OutputShape, resize: Option<&crate::resize::Target>) -> OutputShape {
    match resize {
        Some(t) => OutputShape {
            height: t.height,
            width: t.width,
            channels: shape.channels,
        },
        None => shape,
    }
}

/// Probes, allocates and decodes in one call.
pub fn decode(data: &[u8], opts: &DecodeOptions) -> Result<(ImageInfo, Vec<u8>)> {
    let info = probe(data, &opts.limits)?;
    let out = decode_resized(data, &info, opts, None)?;
    Ok((info, out))
}

/// What the caller wants the pixels converted to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    pub mode: Mode,
    pub background: [u8; 3],
}

/// Third-party decoders may panic on hostile input; a panic must become a
/// typed error, never a dead process.
fn guard<T>(format: Format, f: impl FnOnce() -> Result<T>) -> Result<T> {
    quiet_guarded_panics();
    GUARDED.with(|g| g.set(true));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(false));
    match outcome {
        Ok(result) => result,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::decode(format!(
                "{} decoder failed on malformed data: {what}",
                format.name()
            )))
        }
    }
}

thread_local! {
    static GUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A caught decoder panic is reported as an error; keep the default hook
/// from also printing it to stderr. Panics elsewhere print as usual.
fn quiet_guarded_panics() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(|g| g.get()) {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every decoder input the fuzzer kept (fuzz/regressions/decode: 8
    /// option bytes, then the image) decodes to bytes that do not depend on
    /// what the output buffer held before, or fails: a buffer's old contents
    /// (another image's pixels, in a reused slot) never leak through.
    #[test]
    fn fuzz_regressions_never_leave_output_bytes_unwritten() {
        let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/decode");
        let mut checked = 0;
        for entry in std::fs::read_dir(folder).expect("the regression folder") {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            if data.len() <= 8 {
                continue;
            }
            let (options, image) = data.split_at(8);
            let mode = [Mode::L, Mode::Rgb, Mode::Rgba, Mode::Rgba][(options[0] & 3) as usize];
            let opts = DecodeOptions {
                mode,
                background: [options[4], options[5], options[6]],
                limits: Limits::default(),
                apply_exif_orientation: options[0] & 4 != 0,
            };
            let Ok(info) = probe(image, &opts.limits) else {
                continue;
            };
            let len = info.output_shape(&opts).len();
            let mut zeros = vec![0u8; len];
            let mut marked = vec![0xA5u8; len];
            let a = decode_into(image, &info, &opts, &mut zeros);
            let b = decode_into(image, &info, &opts, &mut marked);
            assert_eq!(a.is_ok(), b.is_ok());
            if a.is_ok() {
                assert!(zeros == marked, "output depends on the buffer's old bytes");
            }
            assert_fresh_buffers_fully_written(image, &opts, a.ok().map(|()| &zeros[..]));
            checked += 1;
        }
        assert!(
            checked > 0,
            "no regression input was decodable far enough to check"
        );
    }

    /// `decode` (whose JPEG and still-WebP buffers are not zero-filled)
    /// gives the same result over two different fills of its new buffers,
    /// and the same as `decode_into` (`expected`, when that succeeded).
    fn assert_fresh_buffers_fully_written(
        image: &[u8],
        opts: &DecodeOptions,
        expected: Option<&[u8]>,
    ) {
        poison::set(0x00);
        let a = decode(image, opts);
        poison::set(0xFF);
        let b = decode(image, opts);
        poison::set(0xA5);
        assert_eq!(a.is_ok(), b.is_ok(), "decode is not deterministic");
        if let (Ok((_, a)), Ok((_, b))) = (&a, &b) {
            assert!(a == b, "decode left bytes of a new buffer unwritten");
        }
        if let Some(expected) = expected {
            let (_, pixels) = a.expect("decode fails where decode_into succeeds");
            assert!(pixels == expected, "decode and decode_into differ");
        }
    }

    /// Every JPEG and WebP of the corpus, whole, truncated and with bytes
    /// flipped (recoverable damage takes libjpeg-turbo's warning path), in
    /// every mode, with and without orientation: no byte of a new buffer
    /// is left as it was allocated.
    #[test]
    fn fresh_buffers_are_fully_written() {
        let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/corpus/pillow");
        let Ok(entries) = std::fs::read_dir(folder) else {
            eprintln!("no corpus at {folder}; skipped");
            return;
        };
        let mut checked = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(ext, "jpg" | "jpeg" | "webp") {
                continue;
            }
            let data = std::fs::read(&path).unwrap();
            let mut variants = vec![data.clone()];
            for cut in [
                data.len() / 2,
                data.len() * 9 / 10,
                data.len().saturating_sub(2),
            ] {
                variants.push(data[..cut].to_vec());
            }
            for at in [data.len() / 3, data.len() / 2, data.len() * 3 / 4] {
                let mut flipped = data.clone();
                flipped[at] ^= 0x5A;
                variants.push(flipped);
            }
            for image in &variants {
                for mode in [Mode::L, Mode::Rgb, Mode::Rgba] {
                    for apply_exif_orientation in [false, true] {
                        let opts = DecodeOptions {
                            mode,
                            apply_exif_orientation,
                            ..DecodeOptions::default()
                        };
                        let Ok(info) = probe(image, &opts.limits) else {
                            continue;
                        };
                        let mut zeros = vec![0u8; info.output_shape(&opts).len()];
                        let expected = decode_into(image, &info, &opts, &mut zeros);
                        assert_fresh_buffers_fully_written(
                            image,
                            &opts,
                            expected.ok().map(|()| &zeros[..]),
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100, "only {checked} decodes checked");
    }
}
