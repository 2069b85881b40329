//! WebP through `image-webp`: RGB, or RGBA when the file carries alpha;
//! animations give their first frame over a transparent canvas, as libwebp's
//! animation decoder (which Pillow uses) does.

use std::io::Cursor;

use image_webp::WebPDecoder;

use super::convert::{self, Raster};
use super::{Format, ImageInfo, Limits, Mode, Target};
use crate::errors::{Error, Result};

fn err(e: image_webp::DecodingError) -> Error {
    match e {
        image_webp::DecodingError::MemoryLimitExceeded
        | image_webp::DecodingError::ImageTooLarge => Error::ImageTooLarge(format!("WEBP: {e}")),
        other => Error::decode(format!("WEBP: {other}")),
    }
}

fn open<'a>(data: &'a [u8], limits: &Limits) -> Result<WebPDecoder<Cursor<&'a [u8]>>> {
    // libwebp (so Pillow) refuses a file shorter than its RIFF header says.
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

pub fn decode(
    data: &[u8],
    _info: &ImageInfo,
    limits: &Limits,
    target: Target,
    out: &mut [u8],
) -> Result<()> {
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
