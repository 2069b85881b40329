//! BMP, TIFF, ICO, TGA, PNM and QOI through the `image` crate's decoders,
//! mapped onto Pillow's modes (16-bit colour keeps the high byte as Pillow's
//! unpackers do; 16-bit grey is clipped as Pillow's "I"/"I;16" conversions).

use std::io::Cursor;

use image::{ColorType, ImageDecoder, ImageFormat, ImageReader};

use super::convert::{self, Raster};
use super::{Format, ImageInfo, Limits, Target};
use crate::errors::{Error, Result};

fn image_format(format: Format) -> ImageFormat {
    match format {
        Format::Bmp => ImageFormat::Bmp,
        Format::Tiff => ImageFormat::Tiff,
        Format::Ico => ImageFormat::Ico,
        Format::Tga => ImageFormat::Tga,
        Format::Pnm => ImageFormat::Pnm,
        Format::Qoi => ImageFormat::Qoi,
        Format::Jpeg => ImageFormat::Jpeg,
        Format::Png => ImageFormat::Png,
        Format::Gif => ImageFormat::Gif,
        Format::WebP => ImageFormat::WebP,
    }
}

fn err(format: Format, e: image::ImageError) -> Error {
    let name = format.name();
    match e {
        image::ImageError::Limits(l) => Error::ImageTooLarge(format!("{name}: {l}")),
        image::ImageError::Unsupported(u) => Error::UnsupportedFormat(format!("{name}: {u}")),
        image::ImageError::IoError(io) => {
            Error::decode(format!("{name}: truncated or unreadable data ({io})"))
        }
        other => Error::decode(format!("{name}: {other}")),
    }
}

fn decoder<'a>(format: Format, data: &'a [u8], limits: &Limits) -> Result<impl ImageDecoder + 'a> {
    let mut reader = ImageReader::with_format(Cursor::new(data), image_format(format));
    let mut l = image::Limits::default();
    l.max_image_width = Some(limits.max_side);
    l.max_image_height = Some(limits.max_side);
    l.max_alloc = Some(limits.scratch_bytes());
    reader.limits(l);
    reader.into_decoder().map_err(|e| err(format, e))
}

/// Pillow's mode name for what the decoder produces.
fn pillow_mode(format: Format, color: ColorType) -> Result<&'static str> {
    Ok(match color {
        ColorType::L8 => "L",
        ColorType::La8 | ColorType::La16 => "LA",
        ColorType::Rgb8 | ColorType::Rgb16 => "RGB",
        ColorType::Rgba8 | ColorType::Rgba16 => "RGBA",
        ColorType::L16 => "I;16",
        other => {
            return Err(Error::UnsupportedFormat(format!(
                "{}: pixel type {other:?} is not supported",
                format.name()
            )))
        }
    })
}

pub fn probe(format: Format, data: &[u8], limits: &Limits) -> Result<ImageInfo> {
    match format {
        Format::Tiff => check_tiff_subset(data)?,
        Format::Bmp => check_bmp_layout(data)?,
        Format::Ico => check_ico_entries(data)?,
        _ => {}
    }
    let mut dec = decoder(format, data, limits)?;
    let (width, height) = dec.dimensions();
    let color_type = pillow_mode(format, dec.color_type())?;
    let orientation = dec
        .orientation()
        .map(super::orient::exif_value)
        .unwrap_or(1);
    Ok(ImageInfo {
        format,
        width,
        height,
        color_type,
        orientation,
    })
}

pub fn decode(
    data: &[u8],
    info: &ImageInfo,
    limits: &Limits,
    target: Target,
    out: &mut [u8],
) -> Result<()> {
    let format = info.format;
    let dec = decoder(format, data, limits)?;
    let color = dec.color_type();
    let len = usize::try_from(dec.total_bytes()).map_err(|_| {
        Error::ImageTooLarge(format!("{}: image does not fit in memory", format.name()))
    })?;
    let mut buf = vec![0u8; len];
    dec.read_image(&mut buf).map_err(|e| err(format, e))?;
    let high_bytes = |buf: &[u8]| -> Vec<u8> {
        buf.chunks_exact(2)
            .map(|b| (u16::from_ne_bytes([b[0], b[1]]) >> 8) as u8)
            .collect()
    };
    if format == Format::Tga && color == ColorType::Rgba8 && tga_declares_no_alpha(data) {
        for px in buf.chunks_exact_mut(4) {
            px[3] = 255;
        }
    }
    let raster = match color {
        ColorType::L8 => Raster::L(buf),
        ColorType::La8 => Raster::La(buf),
        ColorType::Rgb8 => Raster::Rgb(buf),
        ColorType::Rgba8 => Raster::Rgba(buf),
        ColorType::L16 => Raster::Wide(
            buf.chunks_exact(2)
                .map(|b| u32::from(u16::from_ne_bytes([b[0], b[1]])))
                .collect(),
        ),
        ColorType::La16 => Raster::La(high_bytes(&buf)),
        ColorType::Rgb16 => Raster::Rgb(high_bytes(&buf)),
        ColorType::Rgba16 => Raster::Rgba(high_bytes(&buf)),
        other => {
            return Err(Error::UnsupportedFormat(format!(
                "{}: pixel type {other:?} is not supported",
                format.name()
            )))
        }
    };
    convert::write(&raster, target, out)
}

/// TGA has no magic number; accept the header only if it passes the checks
/// Pillow's TgaImagePlugin makes.
pub fn looks_like_tga(data: &[u8]) -> bool {
    let Some(h) = data.get(..18) else {
        return false;
    };
    let colormap_type = h[1];
    let image_type = h[2];
    let colormap_depth = h[7];
    let width = u16::from_le_bytes([h[12], h[13]]);
    let height = u16::from_le_bytes([h[14], h[15]]);
    let depth = h[16];
    colormap_type <= 1
        && width > 0
        && height > 0
        && [1, 8, 16, 24, 32].contains(&depth)
        && [1, 2, 3, 9, 10, 11].contains(&image_type)
        && (colormap_type == 0 || [16, 24, 32].contains(&colormap_depth))
}

/// Pillow makes an RGBA TGA opaque when its version-2 footer points at an
/// extension area whose attributes type is 0 ("no alpha").
fn tga_declares_no_alpha(data: &[u8]) -> bool {
    let Some(footer) = data.len().checked_sub(26).map(|at| &data[at..]) else {
        return false;
    };
    if !footer.ends_with(b"TRUEVISION-XFILE.\0") {
        return false;
    }
    let offset = u32::from_le_bytes([footer[0], footer[1], footer[2], footer[3]]) as usize;
    offset != 0 && data.get(offset + 494) == Some(&0)
}

fn unsupported_tiff(what: String) -> Error {
    Error::UnsupportedFormat(format!("TIFF: {what} is not supported"))
}

/// TIFF is a family of formats; pixelwire decodes the plain subset whose
/// pixels it can guarantee equal to Pillow's (8/16-bit unsigned grey, RGB or
/// RGBA with straight alpha, chunky, uncompressed/LZW/Deflate/PackBits/CCITT,
/// upright). Anything else is refused up front rather than decoded differently.
fn check_tiff_subset(data: &[u8]) -> Result<()> {
    use tiff::tags::Tag;
    if data.get(2..4).is_some_and(|m| m == [43, 0] || m == [0, 43]) {
        return Err(unsupported_tiff("BigTIFF".into()));
    }
    let mut dec = tiff::decoder::Decoder::new(Cursor::new(data))
        .map_err(|e| Error::decode(format!("TIFF: {e}")))?;
    // Each tag may hold one value or one per sample; all must pass, so a
    // differing value is reported in preference to the first.
    let mut tag_values = |t: Tag| -> Result<Vec<u32>> {
        dec.find_tag_unsigned_vec::<u32>(t)
            .map(Option::unwrap_or_default)
            .map_err(|e| Error::decode(format!("TIFF: {e}")))
    };
    let first_odd = |values: Vec<u32>| {
        values
            .iter()
            .copied()
            .find(|&v| v != values[0])
            .or(values.first().copied())
    };
    let mut tag = |t: Tag| -> Result<Option<u32>> { tag_values(t).map(first_odd) };
    let compression = tag(Tag::Compression)?.unwrap_or(1);
    if ![1, 2, 3, 4, 5, 8, 32773, 32946].contains(&compression) {
        return Err(unsupported_tiff(format!("compression {compression}")));
    }
    let photometric = tag(Tag::PhotometricInterpretation)?.unwrap_or(1);
    if ![0, 1, 2].contains(&photometric) {
        return Err(unsupported_tiff(format!(
            "photometric interpretation {photometric} (palette, CMYK, YCbCr, Lab)"
        )));
    }
    if tag(Tag::PlanarConfiguration)?.unwrap_or(1) != 1 {
        return Err(unsupported_tiff("planar (separate-plane) layout".into()));
    }
    let orientation = tag(Tag::Orientation)?.unwrap_or(1);
    if orientation != 1 {
        return Err(unsupported_tiff(format!("orientation tag {orientation}")));
    }
    if tag(Tag::SampleFormat)?.unwrap_or(1) != 1 {
        return Err(unsupported_tiff("signed or floating-point samples".into()));
    }
    if let Some(bits) = tag(Tag::BitsPerSample)? {
        if ![1, 8, 16].contains(&bits) {
            return Err(unsupported_tiff(format!("{bits}-bit samples")));
        }
    }
    if tag(Tag::ExtraSamples)?.is_some_and(|v| v != 2) {
        return Err(unsupported_tiff("premultiplied (associated) alpha".into()));
    }
    // Pillow (libtiff) refuses strips or tiles that run past the end of the
    // file, and an IFD cut short; the tiff crate is more forgiving.
    let ends = |offsets: Vec<u32>, counts: Vec<u32>| {
        offsets
            .iter()
            .zip(&counts)
            .map(|(&o, &c)| u64::from(o) + u64::from(c))
            .max()
    };
    let strips = ends(
        tag_values(Tag::StripOffsets)?,
        tag_values(Tag::StripByteCounts)?,
    );
    let tiles = ends(
        tag_values(Tag::TileOffsets)?,
        tag_values(Tag::TileByteCounts)?,
    );
    let needed = strips
        .into_iter()
        .chain(tiles)
        .chain(first_ifd_end(data))
        .max()
        .unwrap_or(0);
    if needed > data.len() as u64 {
        return Err(Error::decode(format!(
            "TIFF: file is truncated (image data runs to byte {needed}, file has {})",
            data.len()
        )));
    }
    Ok(())
}

/// Pillow and the `image` crate disagree on palette BMPs whose pixel data
/// offset points inside the palette; refuse those rather than guess.
fn check_bmp_layout(data: &[u8]) -> Result<()> {
    let Some(h) = data.get(..54) else {
        return Ok(());
    };
    let u32le = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let pixel_offset = u64::from(u32le(10));
    let header_size = u64::from(u32le(14));
    let bits = u16::from_le_bytes([h[28], h[29]]);
    if header_size >= 40 && bits <= 8 {
        let used = u64::from(u32le(46));
        let entries = if used == 0 { 1u64 << bits } else { used };
        let palette_end = 14 + header_size + 4 * entries;
        if pixel_offset < palette_end {
            return Err(Error::UnsupportedFormat(format!(
                "BMP: pixel data offset {pixel_offset} lies inside the {entries}-entry palette (ends at {palette_end})"
            )));
        }
    }
    Ok(())
}

/// Where the first IFD (with its next-IFD pointer) ends.
fn first_ifd_end(data: &[u8]) -> Option<u64> {
    let little = data.get(..2)? == b"II";
    let read = |at: usize, n: usize| -> Option<u64> {
        let b = data.get(at..at + n)?;
        Some(if little {
            b.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x))
        } else {
            b.iter().fold(0u64, |v, &x| (v << 8) | u64::from(x))
        })
    };
    let big = read(2, 2)? == 43;
    if big {
        let at = read(8, 8)?;
        let count = read(usize::try_from(at).ok()?, 8)?;
        Some(at + 8 + 20 * count + 8)
    } else {
        let at = read(4, 4)?;
        let count = read(usize::try_from(at).ok()?, 2)?;
        Some(at + 2 + 12 * count + 4)
    }
}

/// Every ICO directory entry must lie inside the file (Pillow: "not enough
/// image data"); the `image` crate reads short entries without complaint.
fn check_ico_entries(data: &[u8]) -> Result<()> {
    let count = data
        .get(4..6)
        .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
        .unwrap_or(0);
    for i in 0..count {
        let Some(e) = data.get(6 + 16 * i..6 + 16 * (i + 1)) else {
            return Err(Error::decode("ICO: directory is truncated"));
        };
        let size = u64::from(u32::from_le_bytes([e[8], e[9], e[10], e[11]]));
        let offset = u64::from(u32::from_le_bytes([e[12], e[13], e[14], e[15]]));
        if offset + size > data.len() as u64 {
            return Err(Error::decode(format!(
                "ICO: entry {i} runs to byte {}, file has {}",
                offset + size,
                data.len()
            )));
        }
    }
    Ok(())
}
