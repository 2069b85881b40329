//! PNG through the `png` crate. Layouts follow Pillow's PngImagePlugin:
//! 16-bit colour keeps the high byte, 16-bit grey is "I;16" (clipped later),
//! palette and tRNS transparency stay outside the mode (dropped for RGB).

use std::io::Cursor;

use png::{BitDepth, ColorType, Transformations};

use super::convert::{self, Raster};
use super::{Format, ImageInfo, Limits, Mode, Target};
use crate::errors::{Error, Result};

/// Pillow refuses a compressed text chunk that inflates past this
/// (`PngImagePlugin.MAX_TEXT_CHUNK`).
const MAX_TEXT_CHUNK: usize = 1024 * 1024;

fn err(e: png::DecodingError) -> Error {
    match e {
        png::DecodingError::LimitsExceeded => {
            Error::ImageTooLarge("PNG: decoder memory limit exceeded".into())
        }
        png::DecodingError::Format(f) => Error::decode(format!("PNG: {f}")),
        png::DecodingError::IoError(io) => {
            Error::decode(format!("PNG: truncated or unreadable data ({io})"))
        }
        other => Error::decode(format!("PNG: {other}")),
    }
}

fn reader<'a>(
    data: &'a [u8],
    limits: &Limits,
    transform: Transformations,
) -> Result<png::Reader<Cursor<&'a [u8]>>> {
    let mut dec = png::Decoder::new_with_limits(
        Cursor::new(data),
        png::Limits {
            bytes: usize::try_from(limits.scratch_bytes()).unwrap_or(usize::MAX),
        },
    );
    dec.set_ignore_text_chunk(false);
    dec.set_transformations(transform);
    dec.read_info().map_err(err)
}

fn pillow_mode(info: &png::Info) -> &'static str {
    match (info.color_type, info.bit_depth) {
        (ColorType::Grayscale, BitDepth::One) => "1",
        (ColorType::Grayscale, BitDepth::Sixteen) => "I;16",
        (ColorType::Grayscale, _) => "L",
        (ColorType::GrayscaleAlpha, _) => "LA",
        (ColorType::Rgb, _) => "RGB",
        (ColorType::Rgba, _) => "RGBA",
        (ColorType::Indexed, _) => "P",
    }
}

pub fn probe(data: &[u8], limits: &Limits) -> Result<ImageInfo> {
    check_compression_methods(data)?;
    let r = reader(data, limits, Transformations::IDENTITY)?;
    let info = r.info();
    let orientation = orientation(info).unwrap_or(1);
    Ok(ImageInfo {
        format: Format::Png,
        width: info.width,
        height: info.height,
        color_type: pillow_mode(info),
        orientation,
    })
}

/// EXIF (eXIf chunk), else ImageMagick's raw EXIF profile text, else XMP,
/// in the order Pillow's `getexif` consults them.
fn orientation(info: &png::Info) -> Option<u8> {
    use super::orient;
    if let Some(o) = info.exif_metadata.as_deref().and_then(orient::from_exif) {
        return Some(o);
    }
    let mut texts: Vec<(String, String)> = info
        .uncompressed_latin1_text
        .iter()
        .map(|t| (t.keyword.clone(), t.text.clone()))
        .collect();
    for z in &info.compressed_latin1_text {
        let mut z = z.clone();
        if z.decompress_text_with_limit(MAX_TEXT_CHUNK).is_ok() {
            if let Ok(text) = z.get_text() {
                texts.push((z.keyword.clone(), text));
            }
        }
    }
    for i in &info.utf8_text {
        let mut i = i.clone();
        if i.decompress_text_with_limit(MAX_TEXT_CHUNK).is_ok() {
            if let Ok(text) = i.get_text() {
                texts.push((i.keyword.clone(), text));
            }
        }
    }
    let find = |key: &str| {
        texts
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    find("Raw profile type exif")
        .and_then(orient::from_raw_profile)
        .or_else(|| find("XML:com.adobe.xmp").and_then(|x| orient::from_xmp(x.as_bytes())))
}

pub fn decode(
    data: &[u8],
    info: &ImageInfo,
    limits: &Limits,
    target: Target,
    out: &mut [u8],
) -> Result<()> {
    let wide_gray = info.color_type == "I;16";
    let transform = if wide_gray {
        Transformations::IDENTITY
    } else {
        Transformations::EXPAND | Transformations::STRIP_16
    };
    let mut r = reader(data, limits, transform)?;
    let (color, depth) = r.output_color_type();
    let keyed = r.info().trns.is_some() || r.info().color_type == ColorType::Indexed;
    let len = r
        .output_buffer_size()
        .ok_or_else(|| Error::ImageTooLarge("PNG: image does not fit in memory".into()))?;
    let direct = !wide_gray
        && matches!(
            (color, target.mode),
            (ColorType::Grayscale, Mode::L)
                | (ColorType::Rgb, Mode::Rgb)
                | (ColorType::Rgba, Mode::Rgba)
        )
        && len == out.len();
    if direct {
        r.next_frame(out).map_err(err)?;
        finish(&mut r)?;
        return Ok(());
    }
    let mut buf = vec![0u8; len];
    r.next_frame(&mut buf).map_err(err)?;
    finish(&mut r)?;
    let key = r.info().trns.as_deref().and_then(|t| match t {
        // The png crate keeps one byte of a grey key below 16 bits.
        [low] => Some(u16::from(*low)),
        [high, low, ..] => Some(u16::from_be_bytes([*high, *low])),
        [] => None,
    });
    let raster = match (color, depth) {
        (ColorType::Grayscale, BitDepth::Sixteen) => {
            let values = buf
                .chunks_exact(2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]));
            match key {
                // Grey with tRNS: Pillow compares the clipped value with the key.
                Some(key) => Raster::LKeyed(
                    values
                        .flat_map(|v| [v.min(255) as u8, if v.min(255) == key { 0 } else { 255 }])
                        .collect(),
                ),
                None => Raster::Wide(values.map(u32::from).collect()),
            }
        }
        // Low-bit grey with tRNS that came through without an alpha channel.
        (ColorType::Grayscale, _) if key.is_some() && (r.info().bit_depth as u8) < 8 => {
            let mut grey_alpha: Vec<u8> = buf.iter().flat_map(|&v| [v, 255]).collect();
            pillow_grey_key(&mut grey_alpha, r.info().bit_depth as u8, key.unwrap_or(0));
            Raster::LKeyed(grey_alpha)
        }
        (ColorType::Grayscale, _) => Raster::L(buf),
        (ColorType::GrayscaleAlpha, _) if keyed => {
            let source = r.info();
            if source.color_type == ColorType::Grayscale && (source.bit_depth as u8) < 8 {
                if let Some(raw) = key {
                    pillow_grey_key(&mut buf, source.bit_depth as u8, raw);
                }
            }
            Raster::LKeyed(buf)
        }
        (ColorType::GrayscaleAlpha, _) => Raster::La(buf),
        (ColorType::Rgb, _) => Raster::Rgb(buf),
        (ColorType::Rgba, _) if r.info().color_type == ColorType::Rgb => Raster::RgbTrns(buf),
        (ColorType::Rgba, _) if keyed => Raster::RgbKeyed(buf),
        (ColorType::Rgba, _) => Raster::Rgba(buf),
        (ColorType::Indexed, _) => return Err(Error::decode("PNG: palette was not expanded")),
    };
    convert::write(&raster, target, out)
}

/// Re-keys low-bit-depth grey against tRNS the way Pillow does: it keeps the
/// key as stored (255 for any non-zero key of a 1-bit image) and compares it
/// with the pixels scaled to 8 bits, so a 2- or 4-bit key rarely matches.
fn pillow_grey_key(grey_alpha: &mut [u8], bit_depth: u8, raw: u16) {
    let key = if bit_depth == 1 {
        if raw != 0 {
            255
        } else {
            0
        }
    } else {
        raw
    };
    for p in grey_alpha.chunks_exact_mut(2) {
        p[1] = if u16::from(p[0]) == key { 0 } else { 255 };
    }
}

/// Reads to IEND as Pillow does (a truncated tail is an error there too) and
/// applies Pillow's cap on compressed text chunks.
fn finish(r: &mut png::Reader<Cursor<&[u8]>>) -> Result<()> {
    r.finish().map_err(err)?;
    let info = r.info();
    for chunk in &info.compressed_latin1_text {
        let mut chunk = chunk.clone();
        chunk
            .decompress_text_with_limit(MAX_TEXT_CHUNK)
            .map_err(|_| {
                Error::ImageTooLarge(format!(
                    "PNG: zTXt chunk inflates past {MAX_TEXT_CHUNK} bytes"
                ))
            })?;
    }
    for chunk in info.utf8_text.iter().filter(|c| c.compressed) {
        let mut chunk = chunk.clone();
        chunk
            .decompress_text_with_limit(MAX_TEXT_CHUNK)
            .map_err(|_| {
                Error::ImageTooLarge(format!(
                    "PNG: iTXt chunk inflates past {MAX_TEXT_CHUNK} bytes"
                ))
            })?;
    }
    Ok(())
}

/// Pillow refuses a PNG whose IHDR, iCCP or zTXt names a compression method
/// other than 0 (the only one defined); the `png` crate does not look.
fn check_compression_methods(data: &[u8]) -> Result<()> {
    let mut at = 8;
    while let Some(head) = data.get(at..at + 8) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let kind = &head[4..8];
        let Some(body) = data.get(at + 8..(at + 8).saturating_add(len)) else {
            break;
        };
        let method = match kind {
            b"IHDR" => body.get(10).copied(),
            b"iCCP" | b"zTXt" => body
                .iter()
                .position(|&b| b == 0)
                .and_then(|nul| body.get(nul + 1))
                .copied(),
            b"IDAT" | b"IEND" => break,
            _ => None,
        };
        if let Some(m) = method.filter(|&m| m != 0) {
            let name = String::from_utf8_lossy(kind);
            return Err(Error::UnsupportedFormat(format!(
                "PNG: unknown compression method {m} in {name} chunk"
            )));
        }
        at += 12 + len;
    }
    Ok(())
}
