//! EXIF orientation, applied as `PIL.ImageOps.exif_transpose` does.

use std::mem::MaybeUninit;

use image::metadata::Orientation;

/// The EXIF tag value (1..=8) of an orientation.
pub fn exif_value(o: Orientation) -> u8 {
    match o {
        Orientation::NoTransforms => 1,
        Orientation::FlipHorizontal => 2,
        Orientation::Rotate180 => 3,
        Orientation::FlipVertical => 4,
        Orientation::Rotate90FlipH => 5,
        Orientation::Rotate90 => 6,
        Orientation::Rotate270FlipH => 7,
        Orientation::Rotate270 => 8,
    }
}

/// Orientation tag of an EXIF blob (TIFF structure, with or without the
/// "Exif\0\0" prefix some containers keep).
pub fn from_exif(blob: &[u8]) -> Option<u8> {
    let tiff = blob.strip_prefix(b"Exif\0\0").unwrap_or(blob);
    Orientation::from_exif_chunk(tiff).map(exif_value)
}

/// `tiff:Orientation` from an XMP packet, either as an attribute
/// (`tiff:Orientation="6"`) or an element (`<tiff:Orientation>6<`); Pillow
/// falls back to it when EXIF has none.
pub fn from_xmp(xmp: &[u8]) -> Option<u8> {
    const KEY: &[u8] = b"tiff:Orientation";
    let at = xmp.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let value = xmp[at..]
        .iter()
        .skip_while(|b| matches!(b, b'=' | b'"' | b'\'' | b'>' | b' '));
    let digit = *value.take(1).next()?;
    let o = digit.checked_sub(b'0')?;
    (1..=8).contains(&o).then_some(o)
}

/// ImageMagick's "Raw profile type exif" PNG text: a header line, a length
/// line, then the EXIF blob in hex.
pub fn from_raw_profile(text: &str) -> Option<u8> {
    let hex: Vec<u8> = text
        .lines()
        .skip(3)
        .flat_map(|l| l.trim().bytes())
        .collect();
    let blob: Option<Vec<u8>> = hex
        .chunks_exact(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect();
    from_exif(&blob?)
}

/// Orientations 5 to 8 turn the image on its side.
pub fn swaps_axes(orientation: u8) -> bool {
    (5..=8).contains(&orientation)
}

/// Writes the upright image into `out`. `src` is `w`x`h` as stored.
pub fn apply(orientation: u8, src: &[u8], w: usize, h: usize, channels: usize, out: &mut [u8]) {
    // SAFETY: `apply_uninit` stores only initialised bytes, so `out` stays
    // initialised throughout.
    let out = unsafe { &mut *(out as *mut [u8] as *mut [MaybeUninit<u8>]) };
    apply_uninit(orientation, src, w, h, channels, out);
}

/// Writes the upright image into `out`, which need not be initialised: every
/// byte of it is written (the output pixels are a permutation of the
/// source's, and `out` is checked to be exactly that size).
pub fn apply_uninit(
    orientation: u8,
    src: &[u8],
    w: usize,
    h: usize,
    channels: usize,
    out: &mut [MaybeUninit<u8>],
) {
    assert!(
        src.len() == w * h * channels && out.len() == src.len(),
        "orientation buffers do not match the image"
    );
    let (ow, oh) = if swaps_axes(orientation) {
        (h, w)
    } else {
        (w, h)
    };
    for oy in 0..oh {
        for ox in 0..ow {
            // Source coordinate of output pixel (ox, oy).
            let (sx, sy) = match orientation {
                2 => (w - 1 - ox, oy),
                3 => (w - 1 - ox, h - 1 - oy),
                4 => (ox, h - 1 - oy),
                5 => (oy, ox),
                6 => (oy, h - 1 - ox),
                7 => (w - 1 - oy, h - 1 - ox),
                8 => (w - 1 - oy, ox),
                _ => (ox, oy),
            };
            let s = (sy * w + sx) * channels;
            let o = (oy * ow + ox) * channels;
            for (dst, &v) in out[o..o + channels].iter_mut().zip(&src[s..s + channels]) {
                *dst = MaybeUninit::new(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2x1 image [a b]; orientation 6 (rotate 90 clockwise to view) stores the
    /// top of the picture on the left.
    #[test]
    fn rotations() {
        let src = [1u8, 2];
        let mut out = [0u8; 2];
        apply(6, &src, 2, 1, 1, &mut out);
        assert_eq!(out, [1, 2]);
        apply(8, &src, 2, 1, 1, &mut out);
        assert_eq!(out, [2, 1]);
        apply(2, &src, 2, 1, 1, &mut out);
        assert_eq!(out, [2, 1]);
    }
}
