//! WebP: RGB, or RGBA when the file carries alpha. Still images (lossy,
//! lossless, with or without alpha) are decoded by libwebp, the library
//! Pillow links, which decodes lossy files about twice as fast as
//! `image-webp`; animations give their first frame over a transparent
//! canvas through `image-webp`, as libwebp's animation decoder (which Pillow
//! uses) does. Headers are read by `image-webp`.

use std::io::Cursor;

use image_webp::WebPDecoder;

use libwebp_sys as webp;

use super::convert::{self, Raster};
use super::fresh::Fresh;
use super::{Format, ImageInfo, Limits, Mode, Target};
use crate::errors::{Error, Result};

fn err(e: image_webp::DecodingError) -> Error {
    match e {
        image_webp::DecodingError::MemoryLimitExceeded
        | image_webp::DecodingError::ImageTooLarge => Error::ImageTooLarge(format!("WEBP: {e}")),
        other => Error::decode(format!("WEBP: {other}")),
    }
}

/// libwebp (so Pillow) refuses a file shorter than its RIFF header says.
fn check_riff_size(data: &[u8]) -> Result<()> {
    let declared = data
        .get(4..8)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize + 8);
    if declared.is_some_and(|n| n > data.len()) {
        return Err(Error::decode(format!(
            "WEBP: file is truncated ({} of {} bytes)",
            data.len(),
            declared.unwrap_or(0)
        )));
    }
    Ok(())
}

fn open<'a>(data: &'a [u8], limits: &Limits) -> Result<WebPDecoder<Cursor<&'a [u8]>>> {
    check_riff_size(data)?;
    let mut dec = WebPDecoder::new(Cursor::new(data)).map_err(err)?;
    dec.set_memory_limit(usize::try_from(limits.scratch_bytes()).unwrap_or(usize::MAX));
    if dec.is_animated() {
        dec.set_background_color([0, 0, 0, 0]).map_err(err)?;
    }
    Ok(dec)
}

pub fn probe(data: &[u8], limits: &Limits) -> Result<ImageInfo> {
    let mut dec = open(data, limits)?;
    let (width, height) = dec.dimensions();
    let orientation = dec
        .exif_metadata()
        .ok()
        .flatten()
        .and_then(|exif| super::orient::from_exif(&exif))
        .unwrap_or(1);
    Ok(ImageInfo {
        format: Format::WebP,
        width,
        height,
        color_type: if dec.has_alpha() { "RGBA" } else { "RGB" },
        orientation,
    })
}

/// The layout libwebp writes for a target mode and whether the source has
/// alpha, when that is the output itself: RGB without alpha, and RGBA, where
/// an image without alpha gets alpha 255 as Pillow's RGB to RGBA convert.
fn direct_layout(alpha: bool, mode: Mode) -> Option<(webp::WEBP_CSP_MODE, usize)> {
    match (alpha, mode) {
        (false, Mode::Rgb) => Some((webp::WEBP_CSP_MODE::MODE_RGB, 3)),
        (_, Mode::Rgba) => Some((webp::WEBP_CSP_MODE::MODE_RGBA, 4)),
        _ => None,
    }
}

/// Whether the file is a still image (libwebp's own reading of the header),
/// of the size the probe found.
fn is_still(data: &[u8], info: &ImageInfo) -> Result<bool> {
    // SAFETY: an all-zero WebPBitstreamFeatures is valid plain data, and
    // WebPGetFeatures reads only `data`.
    let mut features: webp::WebPBitstreamFeatures = unsafe { std::mem::zeroed() };
    let status = unsafe { webp::WebPGetFeatures(data.as_ptr(), data.len(), &mut features) };
    if status != webp::VP8StatusCode::VP8_STATUS_OK {
        return Err(Error::decode(format!(
            "WEBP: unreadable header ({status:?})"
        )));
    }
    if features.has_animation != 0 {
        return Ok(false);
    }
    if (features.width, features.height) != (info.width as i32, info.height as i32) {
        return Err(Error::decode(
            "WEBP: the bitstream and the container disagree on the size",
        ));
    }
    Ok(true)
}

/// Decodes a still image with libwebp into `dst` in `layout`.
///
/// # Safety
/// `dst` is valid for writes of `info.width * info.height * channels` bytes.
unsafe fn libwebp_into(
    data: &[u8],
    info: &ImageInfo,
    (layout, channels): (webp::WEBP_CSP_MODE, usize),
    dst: *mut u8,
) -> Result<()> {
    let stride = info.width as usize * channels;
    let mut config = webp::WebPDecoderConfig::new()
        .map_err(|()| Error::decode("WEBP: libwebp version mismatch"))?;
    // Pillow's settings are libwebp's defaults (fancy upsampling, in-loop
    // filtering, no dithering); a second decoding thread would only compete
    // with the other images of a batch.
    config.output.colorspace = layout;
    config.output.is_external_memory = 1;
    config.output.u.RGBA = webp::WebPRGBABuffer {
        rgba: dst,
        stride: i32::try_from(stride)
            .map_err(|_| Error::ImageTooLarge("WEBP: row too wide".into()))?,
        size: stride * info.height as usize,
    };
    // SAFETY: `config` was initialised by libwebp and points its output at
    // `dst`, which the caller vouches for; libwebp checks that the image fits
    // `size` and `stride` before it writes.
    let status = unsafe { webp::WebPDecode(data.as_ptr(), data.len(), &mut config) };
    // SAFETY: frees only what libwebp allocated itself (nothing, with
    // external memory).
    unsafe { webp::WebPFreeDecBuffer(&mut config.output) };
    match status {
        webp::VP8StatusCode::VP8_STATUS_OK => Ok(()),
        webp::VP8StatusCode::VP8_STATUS_OUT_OF_MEMORY => {
            Err(Error::ImageTooLarge("WEBP: out of memory".into()))
        }
        webp::VP8StatusCode::VP8_STATUS_NOT_ENOUGH_DATA => {
            Err(Error::decode("WEBP: image file is truncated"))
        }
        other => Err(Error::decode(format!("WEBP: could not decode ({other:?})"))),
    }
}

/// A still image decoded by libwebp into a new, not zero-filled buffer.
fn libwebp_fresh(
    data: &[u8],
    info: &ImageInfo,
    layout: (webp::WEBP_CSP_MODE, usize),
) -> Result<Vec<u8>> {
    let mut fresh = Fresh::new(info.width as usize * info.height as usize * layout.1);
    // SAFETY: the buffer is width x height x channels bytes.
    unsafe { libwebp_into(data, info, layout, fresh.as_mut_ptr()) }?;
    // SAFETY: every byte was written. WebPDecode returns VP8_STATUS_OK only
    // once every row of the picture went out through its row emitters (the
    // lossy decoder fails with NOT_ENOUGH_DATA or BITSTREAM_ERROR if a
    // macroblock row or the alpha plane cannot be decoded; the lossless one
    // if it stops before the last row), with no cropping or scaling set, and
    // each emitted row is `width` whole pixels of the layout (alpha written
    // as 0xFF when the file has none) at a stride of exactly
    // `width * channels`.
    Ok(unsafe { fresh.assume_filled() })
}

/// Decodes a still image into a new buffer when libwebp writes the requested
/// layout itself; `None` for animations and images that need a conversion.
pub fn decode_fresh(
    data: &[u8],
    info: &ImageInfo,
    _limits: &Limits,
    target: Target,
) -> Result<Option<Vec<u8>>> {
    let Some(layout) = direct_layout(info.color_type == "RGBA", target.mode) else {
        return Ok(None);
    };
    check_riff_size(data)?;
    if !is_still(data, info)? {
        return Ok(None);
    }
    libwebp_fresh(data, info, layout).map(Some)
}

pub fn decode(
    data: &[u8],
    info: &ImageInfo,
    limits: &Limits,
    target: Target,
    out: &mut [u8],
) -> Result<()> {
    check_riff_size(data)?;
    if is_still(data, info)? {
        let alpha = info.color_type == "RGBA";
        if let Some(layout) = direct_layout(alpha, target.mode) {
            if out.len() != info.width as usize * info.height as usize * layout.1 {
                return Err(Error::decode(
                    "WEBP: output buffer does not match the header",
                ));
            }
            // SAFETY: `out` is exactly width x height x channels bytes.
            return unsafe { libwebp_into(data, info, layout, out.as_mut_ptr()) };
        }
        let native = if alpha {
            (webp::WEBP_CSP_MODE::MODE_RGBA, 4)
        } else {
            (webp::WEBP_CSP_MODE::MODE_RGB, 3)
        };
        let pixels = libwebp_fresh(data, info, native)?;
        let raster = if alpha {
            Raster::Rgba(pixels)
        } else {
            Raster::Rgb(pixels)
        };
        return convert::write(&raster, target, out);
    }
    let mut dec = open(data, limits)?;
    let len = dec
        .output_buffer_size()
        .ok_or_else(|| Error::ImageTooLarge("WEBP: image does not fit in memory".into()))?;
    let alpha = dec.has_alpha();
    let direct = matches!(
        (alpha, target.mode),
        (false, Mode::Rgb) | (true, Mode::Rgba)
    );
    if direct && len == out.len() {
        return dec.read_image(out).map_err(err);
    }
    let mut buf = vec![0u8; len];
    dec.read_image(&mut buf).map_err(err)?;
    let raster = if alpha {
        Raster::Rgba(buf)
    } else {
        Raster::Rgb(buf)
    };
    convert::write(&raster, target, out)
}
