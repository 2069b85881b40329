//! Pillow-exact conversion from a decoder's native layout to the output mode.
//!
//! The rules are vLLM's (0.32) `convert_image_mode`: to RGB, anything with
//! transparency (RGBA, LA, palette or tRNS alpha) is converted to RGBA and
//! alpha-composited onto a background; every other change is Pillow's
//! `Image.convert`.

use super::{Mode, Target};
use crate::errors::{Error, Result};

/// Pixels in the layout a decoder produced, named after Pillow's modes.
#[derive(Debug)]
pub enum Raster {
    L(Vec<u8>),
    La(Vec<u8>),
    Rgb(Vec<u8>),
    /// Straight (not premultiplied) alpha from the file itself.
    Rgba(Vec<u8>),
    /// Colour with alpha that Pillow keeps out of the mode (palette or tRNS
    /// transparency): dropped for L, kept for RGBA, composited for RGB.
    RgbKeyed(Vec<u8>),
    /// Truecolour with tRNS: Pillow's mode is RGB, so RGB keeps the colours
    /// (vLLM converts nothing) while RGBA takes the key as alpha.
    RgbTrns(Vec<u8>),
    /// Grey with the same kind of side-band alpha as `RgbKeyed`.
    LKeyed(Vec<u8>),
    /// CMYK with ink amounts (0 = no ink), as Pillow stores it.
    Cmyk(Vec<u8>),
    /// 16- or 32-bit grey ("I;16", "I"): Pillow clips it to 0..=255.
    Wide(Vec<u32>),
}

impl Raster {
    fn channels(&self) -> usize {
        match self {
            Raster::L(_) | Raster::Wide(_) => 1,
            Raster::La(_) | Raster::LKeyed(_) => 2,
            Raster::Rgb(_) => 3,
            Raster::Rgba(_) | Raster::RgbKeyed(_) | Raster::RgbTrns(_) | Raster::Cmyk(_) => 4,
        }
    }

    fn pixel_count(&self) -> usize {
        match self {
            Raster::Wide(v) => v.len(),
            Raster::L(v)
            | Raster::La(v)
            | Raster::Rgb(v)
            | Raster::Rgba(v)
            | Raster::RgbKeyed(v)
            | Raster::RgbTrns(v)
            | Raster::LKeyed(v)
            | Raster::Cmyk(v) => v.len() / self.channels(),
        }
    }
}

/// Pillow's ITU-R 601-2 luma with its rounding (`L24` in Convert.c).
#[inline]
pub fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((u32::from(r) * 19595 + u32::from(g) * 38470 + u32::from(b) * 7471 + 0x8000) >> 16) as u8
}

/// `a * b / 255` rounded as Pillow's `MULDIV255`.
#[inline]
fn muldiv255(a: u32, b: u32) -> u32 {
    let t = a * b + 128;
    ((t >> 8) + t) >> 8
}

/// Pillow's `cmyk2rgb`.
#[inline]
fn cmyk_to_rgb(p: &[u8]) -> [u8; 3] {
    let nk = 255 - u32::from(p[3]);
    let ch = |c: u8| (nk - muldiv255(u32::from(c), nk)) as u8;
    [ch(p[0]), ch(p[1]), ch(p[2])]
}

/// Pillow's paste of an RGBA image onto a solid colour through its own alpha
/// (vLLM's `rgba_to_rgb`): `(src * a + bg * (255 - a)) / 255`, rounded.
#[inline]
fn composite(src: u8, bg: u8, a: u8) -> u8 {
    let t = u32::from(src) * u32::from(a) + u32::from(bg) * (255 - u32::from(a)) + 128;
    (((t >> 8) + t) >> 8) as u8
}

/// Writes `raster` into `out` in `target.mode`.
pub fn write(raster: &Raster, target: Target, out: &mut [u8]) -> Result<()> {
    let n = raster.pixel_count();
    let oc = target.mode.channels();
    if out.len() != n * oc {
        return Err(Error::decode(format!(
            "decoder produced {n} pixels, expected {}",
            out.len() / oc
        )));
    }
    let bg = target.background;
    match (raster, target.mode) {
        (Raster::L(src), Mode::L) => out.copy_from_slice(src),
        (Raster::L(src), _) => expand_gray(src.iter().map(|&v| (v, 255)), oc, out),
        (Raster::Wide(src), Mode::L) => {
            for (o, &v) in out.iter_mut().zip(src) {
                *o = v.min(255) as u8;
            }
        }
        (Raster::Wide(src), _) => {
            expand_gray(src.iter().map(|&v| (v.min(255) as u8, 255)), oc, out)
        }
        (Raster::La(src) | Raster::LKeyed(src), Mode::L) => {
            for (o, p) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = p[0];
            }
        }
        (Raster::La(src) | Raster::LKeyed(src), Mode::Rgb) => {
            for (o, p) in out.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                o[0] = composite(p[0], bg[0], p[1]);
                o[1] = composite(p[0], bg[1], p[1]);
                o[2] = composite(p[0], bg[2], p[1]);
            }
        }
        (Raster::La(src) | Raster::LKeyed(src), _) => {
            expand_gray(src.chunks_exact(2).map(|p| (p[0], p[1])), oc, out)
        }
        (Raster::Rgb(src), Mode::Rgb) => out.copy_from_slice(src),
        (Raster::Rgb(src), Mode::Rgba) => {
            for (o, p) in out.chunks_exact_mut(4).zip(src.chunks_exact(3)) {
                o[..3].copy_from_slice(p);
                o[3] = 255;
            }
        }
        (Raster::Rgb(src), Mode::L) => rgb_to_l(src.chunks_exact(3), out),
        (Raster::Rgba(src) | Raster::RgbKeyed(src) | Raster::RgbTrns(src), Mode::Rgba) => {
            out.copy_from_slice(src)
        }
        (Raster::RgbTrns(src), Mode::Rgb) => {
            for (o, p) in out.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                o.copy_from_slice(&p[..3]);
            }
        }
        (Raster::Rgba(src) | Raster::RgbKeyed(src), Mode::Rgb) => {
            for (o, p) in out.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                let a = p[3];
                o[0] = composite(p[0], bg[0], a);
                o[1] = composite(p[1], bg[1], a);
                o[2] = composite(p[2], bg[2], a);
            }
        }
        (Raster::Rgba(src) | Raster::RgbKeyed(src) | Raster::RgbTrns(src), Mode::L) => {
            rgb_to_l(src.chunks_exact(4), out)
        }
        (Raster::Cmyk(src), Mode::L) => {
            for (o, p) in out.iter_mut().zip(src.chunks_exact(4)) {
                let [r, g, b] = cmyk_to_rgb(p);
                *o = luma(r, g, b);
            }
        }
        (Raster::Cmyk(src), _) => {
            for (o, p) in out.chunks_exact_mut(oc).zip(src.chunks_exact(4)) {
                o[..3].copy_from_slice(&cmyk_to_rgb(p));
                if oc == 4 {
                    o[3] = 255;
                }
            }
        }
    }
    Ok(())
}

fn expand_gray(src: impl Iterator<Item = (u8, u8)>, oc: usize, out: &mut [u8]) {
    for (o, (v, a)) in out.chunks_exact_mut(oc).zip(src) {
        o[0] = v;
        o[1] = v;
        o[2] = v;
        if oc == 4 {
            o[3] = a;
        }
    }
}

fn rgb_to_l<'a>(src: impl Iterator<Item = &'a [u8]>, out: &mut [u8]) {
    for (o, p) in out.iter_mut().zip(src) {
        *o = luma(p[0], p[1], p[2]);
    }
}

/// Expands palette indices. Entries past the palette's end are black and
/// opaque, as in Pillow. `alpha[i]` is entry `i`'s alpha (255 past its end).
pub fn depalette(indices: &[u8], palette_rgb: &[u8], alpha: &[u8]) -> Vec<u8> {
    let mut table = [[0u8, 0, 0, 255]; 256];
    for (i, entry) in table.iter_mut().enumerate() {
        if let Some(rgb) = palette_rgb.get(i * 3..i * 3 + 3) {
            entry[..3].copy_from_slice(rgb);
        }
        if let Some(&a) = alpha.get(i) {
            entry[3] = a;
        }
    }
    let mut out = Vec::with_capacity(indices.len() * 4);
    for &i in indices {
        out.extend_from_slice(&table[usize::from(i)]);
    }
    out
}

/// Spreads packed RGB held in the first three quarters of `buf` into RGBX
/// (X = 255, Pillow's own padding), in place: the layout of a Pillow "RGB"
/// image, so a reader can map the pixels without a copy. Back to front, so
/// no pixel is overwritten before it is read (4i >= 3i + 3 for i >= 3).
pub fn expand_rgb_to_rgbx(buf: &mut [u8]) {
    let pixels = buf.len() / 4;
    for i in (0..pixels).rev() {
        let (r, g, b) = (buf[3 * i], buf[3 * i + 1], buf[3 * i + 2]);
        buf[4 * i..4 * i + 4].copy_from_slice(&[r, g, b, 255]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rgb_expands_to_rgbx_in_place() {
        let rgb: Vec<u8> = (0..30u8).collect(); // 10 pixels
        let mut buf = rgb.clone();
        buf.resize(40, 7);
        expand_rgb_to_rgbx(&mut buf);
        for i in 0..10 {
            assert_eq!(&buf[4 * i..4 * i + 3], &rgb[3 * i..3 * i + 3]);
            assert_eq!(buf[4 * i + 3], 255);
        }
        let mut empty: [u8; 0] = [];
        expand_rgb_to_rgbx(&mut empty);
    }

    #[test]
    fn luma_matches_pillow_rounding() {
        assert_eq!(luma(255, 0, 0), 76);
        assert_eq!(luma(0, 255, 0), 150);
        assert_eq!(luma(100, 150, 200), 141);
        assert_eq!(luma(1, 2, 3), 2);
    }

    #[test]
    fn cmyk_matches_pillow() {
        assert_eq!(cmyk_to_rgb(&[100, 50, 20, 30]), [137, 181, 207]);
        assert_eq!(cmyk_to_rgb(&[200, 200, 200, 200]), [12, 12, 12]);
        assert_eq!(cmyk_to_rgb(&[0, 0, 0, 255]), [0, 0, 0]);
    }

    #[test]
    fn composite_extremes() {
        assert_eq!(composite(10, 255, 255), 10);
        assert_eq!(composite(10, 255, 0), 255);
        assert_eq!(composite(0, 255, 128), 127);
    }

    #[test]
    fn wide_gray_is_clipped() {
        let mut out = [0u8; 3];
        let t = Target {
            mode: Mode::L,
            background: [255; 3],
        };
        write(&Raster::Wide(vec![1, 255, 65535]), t, &mut out).unwrap();
        assert_eq!(out, [1, 255, 255]);
    }
}
