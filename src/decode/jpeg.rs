//! JPEG through libjpeg-turbo (the TurboJPEG 3 API, built from the vendored
//! source), the library Pillow itself uses, with Pillow's settings: accurate
//! integer DCT and fancy upsampling.
//!
//! libjpeg-turbo reports recoverable damage as a warning and fills what is
//! missing; Pillow accepts the warnings but refuses truncated files. So a
//! warning is accepted only when the marker walk shows the image is complete.

use std::ffi::CStr;

use turbojpeg_sys as tj;

use super::convert::{self, Raster};
use super::fresh::Fresh;
use super::{Format, ImageInfo, Limits, Mode, Target};
use crate::errors::{Error, Result};

/// Progressive files can carry thousands of tiny scans to burn CPU; real
/// encoders write at most a few dozen.
const MAX_SCANS: i32 = 1000;

/// One TurboJPEG decompressor instance, destroyed on drop.
struct Handle(tj::tjhandle);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from tj3Init and is destroyed once.
        unsafe { tj::tj3Destroy(self.0) }
    }
}

impl Handle {
    fn new(limits: &Limits) -> Result<Handle> {
        // SAFETY: plain constructor; NULL is checked.
        let ptr = unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as i32) };
        if ptr.is_null() {
            return Err(Error::decode(
                "JPEG: could not create a libjpeg-turbo decompressor",
            ));
        }
        let h = Handle(ptr);
        h.set(tj::TJPARAM_TJPARAM_SCANLIMIT, MAX_SCANS)?;
        h.set(
            tj::TJPARAM_TJPARAM_MAXPIXELS,
            i32::try_from(limits.max_pixels).unwrap_or(i32::MAX),
        )?;
        Ok(h)
    }

    fn set(&self, param: tj::TJPARAM, value: i32) -> Result<()> {
        // SAFETY: valid handle; tj3Set validates the parameter.
        if unsafe { tj::tj3Set(self.0, param as i32, value) } != 0 {
            return Err(self.error());
        }
        Ok(())
    }

    fn get(&self, param: tj::TJPARAM) -> i32 {
        // SAFETY: valid handle.
        unsafe { tj::tj3Get(self.0, param as i32) }
    }

    /// Whether the last failure was only a warning (libjpeg recovered).
    fn only_warned(&self) -> bool {
        // SAFETY: valid handle.
        unsafe { tj::tj3GetErrorCode(self.0) == tj::TJERR_TJERR_WARNING as i32 }
    }

    fn message(&self) -> String {
        // SAFETY: tj3GetErrorStr returns a NUL-terminated string owned by the handle.
        unsafe { CStr::from_ptr(tj::tj3GetErrorStr(self.0)) }
            .to_string_lossy()
            .into_owned()
    }

    fn error(&self) -> Error {
        let msg = self.message();
        if msg.contains("exceeds") || msg.contains("MAXPIXELS") || msg.contains("too large") {
            Error::ImageTooLarge(format!("JPEG: {msg}"))
        } else {
            Error::decode(format!("JPEG: {msg}"))
        }
    }

    fn read_header(&self, data: &[u8]) -> Result<(u32, u32, i32)> {
        // SAFETY: the pointer and length describe `data`.
        if unsafe { tj::tj3DecompressHeader(self.0, data.as_ptr(), data.len() as _) } != 0
            && !self.only_warned()
        {
            return Err(self.error());
        }
        let width = self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH);
        let height = self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT);
        if width <= 0 || height <= 0 {
            return Err(Error::decode(format!(
                "JPEG: invalid size {width}x{height}"
            )));
        }
        Ok((
            width as u32,
            height as u32,
            self.get(tj::TJPARAM_TJPARAM_COLORSPACE),
        ))
    }

    /// Decodes into `out` (exactly width x height x channels of `format`).
    fn decompress(
        &self,
        data: &[u8],
        out: &mut [u8],
        width: u32,
        format: tj::TJPF,
        channels: usize,
    ) -> Result<()> {
        let pitch = width as usize * channels;
        let height = out.len() / pitch;
        let (w, h) = (
            self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH),
            self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT),
        );
        if out.len() != pitch * height || w as u32 != width || h as usize != height {
            return Err(Error::decode(
                "JPEG: output buffer does not match the header",
            ));
        }
        let rc = self.decompress_raw(data, out, pitch, format);
        if rc == 0 {
            return Ok(());
        }
        if !(self.only_warned() && reaches_end_of_image(data)) {
            return Err(self.error());
        }
        // libjpeg-turbo recovered from damage. On some damage it leaves
        // output bytes unwritten, and `out` may hold another image's pixels
        // (pool slots and scratch buffers are reused). Decode again over the
        // complement of the first result: only an output that does not
        // depend on what the buffer held before is accepted.
        let warning = self.message();
        let mut again: Vec<u8> = out.iter().map(|v| !v).collect();
        let rc = self.decompress_raw(data, &mut again, pitch, format);
        if (rc != 0 && !self.only_warned()) || again != out {
            return Err(Error::decode(format!(
                "JPEG: corrupt data stream ({warning}); the decoder could not recover every pixel"
            )));
        }
        Ok(())
    }

    /// tj3Decompress8 into `out`; its return code.
    fn decompress_raw(&self, data: &[u8], out: &mut [u8], pitch: usize, format: tj::TJPF) -> i32 {
        // SAFETY: `out` holds `height` rows of `pitch` bytes (checked by the
        // caller), which is what tj3Decompress8 writes for this header and
        // pixel format.
        unsafe { self.decompress_to(data, out.as_mut_ptr(), pitch, format) }
    }

    /// tj3Decompress8 into `dst`; its return code.
    ///
    /// # Safety
    /// `dst` is valid for writes of JPEGHEIGHT rows of `pitch` bytes, and
    /// `pitch` is at least JPEGWIDTH pixels of `format`.
    unsafe fn decompress_to(
        &self,
        data: &[u8],
        dst: *mut u8,
        pitch: usize,
        format: tj::TJPF,
    ) -> i32 {
        // SAFETY: the handle is valid, `data` describes the input, and the
        // caller vouches for `dst`.
        unsafe {
            tj::tj3Decompress8(
                self.0,
                data.as_ptr(),
                data.len() as _,
                dst,
                pitch as i32,
                format,
            )
        }
    }

    /// Decodes into a new buffer of `height` rows of `width` pixels of
    /// `format`, not zero-filled first.
    fn decompress_fresh(
        &self,
        data: &[u8],
        (width, height): (u32, u32),
        format: tj::TJPF,
        channels: usize,
    ) -> Result<Vec<u8>> {
        let pitch = width as usize * channels;
        let (w, h) = (
            self.get(tj::TJPARAM_TJPARAM_JPEGWIDTH),
            self.get(tj::TJPARAM_TJPARAM_JPEGHEIGHT),
        );
        if w as u32 != width || h as u32 != height {
            return Err(Error::decode(
                "JPEG: output buffer does not match the header",
            ));
        }
        let mut fresh = Fresh::new(pitch * height as usize);
        // SAFETY: the buffer holds `height` rows of `pitch` bytes, the size
        // the header (checked just above) gives for this format.
        let rc = unsafe { self.decompress_to(data, fresh.as_mut_ptr(), pitch, format) };
        if rc == 0 {
            // SAFETY: every byte was written. tj3Decompress8 returns 0 only
            // when neither an error nor a warning was raised (any warning
            // makes it return -1), and it returns only once it has read
            // scanlines until `output_scanline == output_height`, one row
            // pointer per row, `pitch` apart. Each scanline is `width` whole
            // pixels of `format` (libjpeg-turbo's colour converters write
            // the X/alpha byte of RGBA as 0xFF), and `pitch` is exactly
            // `width * channels`, so the rows tile the buffer with no gap.
            // No cropping or scaling is set on this handle.
            return Ok(unsafe { fresh.assume_filled() });
        }
        if !(self.only_warned() && reaches_end_of_image(data)) {
            return Err(self.error());
        }
        // libjpeg-turbo recovered from damage and may have left bytes
        // unwritten: start over from zeros on the checked path, which accepts
        // only an output that does not depend on the buffer's old bytes.
        let mut out = fresh.zeroed();
        self.decompress(data, &mut out, width, format, channels)?;
        Ok(out)
    }
}

/// Source and target modes that libjpeg-turbo converts itself, with the
/// pixel format it writes: Pillow's own conversions of L and RGB to RGB or
/// RGBA are the same (grey copied to each channel, alpha 255).
fn direct_format(color_type: &str, mode: Mode) -> Option<(tj::TJPF, usize)> {
    match (color_type, mode) {
        ("L", Mode::L) => Some((tj::TJPF_TJPF_GRAY, 1)),
        ("L" | "RGB", Mode::Rgb) => Some((tj::TJPF_TJPF_RGB, 3)),
        ("L" | "RGB", Mode::Rgba) => Some((tj::TJPF_TJPF_RGBA, 4)),
        _ => None,
    }
}

/// Pillow refuses truncated files where libjpeg-turbo would fill in grey.
fn check_complete(data: &[u8]) -> Result<()> {
    if !reaches_end_of_image(data) {
        return Err(Error::decode(
            "JPEG: image file is truncated (the scan data never reaches an end-of-image marker)",
        ));
    }
    Ok(())
}

/// Decodes into a new, not zero-filled buffer when libjpeg-turbo writes the
/// requested layout itself; `None` when the image needs a conversion.
pub fn decode_fresh(
    data: &[u8],
    info: &ImageInfo,
    limits: &Limits,
    target: Target,
) -> Result<Option<Vec<u8>>> {
    let Some((format, channels)) = direct_format(info.color_type, target.mode) else {
        return Ok(None);
    };
    check_complete(data)?;
    let h = Handle::new(limits)?;
    let (width, height, _) = h.read_header(data)?;
    h.decompress_fresh(data, (width, height), format, channels)
        .map(Some)
}

fn pillow_mode(colorspace: i32) -> Result<&'static str> {
    Ok(match colorspace as u32 {
        tj::TJCS_TJCS_GRAY => "L",
        tj::TJCS_TJCS_RGB | tj::TJCS_TJCS_YCbCr => "RGB",
        tj::TJCS_TJCS_CMYK | tj::TJCS_TJCS_YCCK => "CMYK",
        other => {
            return Err(Error::UnsupportedFormat(format!(
                "JPEG colour space {other} is not supported"
            )))
        }
    })
}

pub fn probe(data: &[u8], limits: &Limits) -> Result<ImageInfo> {
    let h = Handle::new(limits)?;
    let (width, height, colorspace) = h.read_header(data)?;
    Ok(ImageInfo {
        format: Format::Jpeg,
        width,
        height,
        color_type: pillow_mode(colorspace)?,
        orientation: exif_orientation(data),
    })
}

pub fn decode(
    data: &[u8],
    info: &ImageInfo,
    limits: &Limits,
    target: Target,
    out: &mut [u8],
) -> Result<()> {
    check_complete(data)?;
    let h = Handle::new(limits)?;
    let (width, height, _) = h.read_header(data)?;
    // Direct paths: libjpeg-turbo writes the output layout itself.
    if let Some((format, channels)) = direct_format(info.color_type, target.mode) {
        return h.decompress(data, out, width, format, channels);
    }
    let raster = if info.color_type == "CMYK" {
        let mut cmyk = h.decompress_fresh(data, (width, height), tj::TJPF_TJPF_CMYK, 4)?;
        // Adobe files store CMYK inverted; Pillow reads them as "CMYK;I".
        if has_adobe_marker(data) {
            cmyk.iter_mut().for_each(|v| *v = 255 - *v);
        }
        Raster::Cmyk(cmyk)
    } else {
        Raster::Rgb(h.decompress_fresh(data, (width, height), tj::TJPF_TJPF_RGB, 3)?)
    };
    convert::write(&raster, target, out)
}

/// Marker segments before the first scan, as (marker, payload).
fn header_segments(data: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut i = 2;
    std::iter::from_fn(move || {
        if i + 4 > data.len() || data[i] != 0xFF {
            return None;
        }
        let marker = data[i + 1];
        if marker == 0xDA || marker == 0xD9 {
            return None;
        }
        let len = usize::from(u16::from_be_bytes([data[i + 2], data[i + 3]]));
        let payload = data.get(i + 4..(i + 2 + len).max(i + 4))?;
        i += 2 + len;
        Some((marker, payload))
    })
}

fn has_adobe_marker(data: &[u8]) -> bool {
    header_segments(data).any(|(m, p)| m == 0xEE && p.starts_with(b"Adobe"))
}

fn exif_orientation(data: &[u8]) -> u8 {
    header_segments(data)
        .find(|(m, p)| *m == 0xE1 && p.starts_with(b"Exif\0\0"))
        .and_then(|(_, p)| super::orient::from_exif(p))
        .unwrap_or(1)
}

/// Walks the marker segments of the primary image and reports whether it
/// reaches its EOI. Segment lengths are followed (so a thumbnail embedded in
/// APP1 cannot end the walk) and scan data is skipped up to the next real
/// marker (0xFF 0x00 is stuffing, RST0..7 sit inside scans).
fn reaches_end_of_image(data: &[u8]) -> bool {
    let mut i = 2;
    loop {
        // Bytes between segments are tolerated (libjpeg skips them too).
        while i < data.len() && data[i] != 0xFF {
            i += 1;
        }
        while i < data.len() && data[i] == 0xFF {
            i += 1;
        }
        let Some(&marker) = data.get(i) else {
            return false;
        };
        i += 1;
        match marker {
            0xD9 => return true,
            0x01 | 0xD0..=0xD8 => continue,
            _ => {}
        }
        let Some(len) = data
            .get(i..i + 2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        else {
            return false;
        };
        i += len;
        if i > data.len() {
            return false;
        }
        if marker == 0xDA {
            loop {
                // The entropy-coded data is most of the file (1 MB for a 4K
                // q95 photo): memchr scans it with SIMD, where a byte loop
                // cost 2 % of the decode's instructions.
                let Some(off) = memchr::memchr(0xFF, &data[i..]) else {
                    return false;
                };
                let j = i + off;
                match data.get(j + 1) {
                    None => return false,
                    Some(0x00 | 0xD0..=0xD7) => i = j + 2,
                    Some(_) => {
                        i = j;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_of_image_walk() {
        // SOI, APP0 of length 4, SOS of length 2, entropy bytes with stuffing, EOI.
        let good = [
            0xFF, 0xD8, 0xFF, 0xE0, 0, 4, 1, 2, 0xFF, 0xDA, 0, 2, 7, 0xFF, 0, 9, 0xFF, 0xD9,
        ];
        assert!(reaches_end_of_image(&good));
        assert!(!reaches_end_of_image(&good[..good.len() - 2]));
        // An EOI inside an APP segment does not count.
        let hidden = [
            0xFF, 0xD8, 0xFF, 0xE1, 0, 4, 0xFF, 0xD9, 0xFF, 0xDA, 0, 2, 7,
        ];
        assert!(!reaches_end_of_image(&hidden));
    }
}
