//! GIF, first frame, laid out exactly as Pillow's GifImagePlugin loads it.
//!
//! Written against the block structure directly (LZW through `weezl`) because
//! Pillow's rules differ from a general GIF player's: the canvas grows to the
//! first frame's extent, is pre-filled with the transparent index (else 0),
//! a palette that is the identity grey ramp makes the image mode "L", and a
//! file with no palette at all is also "L".

use weezl::{decode::Decoder as Lzw, BitOrder, LzwStatus};

use super::convert::{self, Raster};
use super::{Format, ImageInfo, Limits, Target};
use crate::errors::{Error, Result};

fn err(msg: impl Into<String>) -> Error {
    Error::decode(format!("GIF: {}", msg.into()))
}

/// The first frame's header, as far as Pillow needs it.
struct FirstFrame<'a> {
    canvas: (u32, u32),
    rect: (u32, u32, u32, u32),
    interlaced: bool,
    /// `None` when the image is greyscale ("L" mode).
    palette: Option<&'a [u8]>,
    transparency: Option<u8>,
    min_code_size: u8,
    /// Offset of the first LZW sub-block.
    data_at: usize,
}

fn u16le(d: &[u8], at: usize) -> u32 {
    u32::from(d[at]) | (u32::from(d[at + 1]) << 8)
}

/// Pillow keeps a palette only if it is not the identity grey ramp.
fn palette_needed(p: &[u8]) -> bool {
    p.chunks_exact(3)
        .enumerate()
        .any(|(i, c)| !(i < 256 && c[0] as usize == i && c[1] as usize == i && c[2] as usize == i))
}

fn take(data: &[u8], at: usize, n: usize) -> Result<&[u8]> {
    data.get(at..at + n).ok_or_else(|| err("truncated file"))
}

/// Skips a chain of data sub-blocks starting at `at`; returns the offset after
/// the terminator.
fn skip_sub_blocks(data: &[u8], mut at: usize) -> Result<usize> {
    loop {
        let n = usize::from(*data.get(at).ok_or_else(|| err("truncated file"))?);
        at += 1;
        if n == 0 {
            return Ok(at);
        }
        take(data, at, n)?;
        at += n;
    }
}

fn first_frame(data: &[u8]) -> Result<FirstFrame<'_>> {
    let header = take(data, 0, 13)?;
    let mut canvas = (u16le(header, 6), u16le(header, 8));
    let flags = header[10];
    let mut at = 13;
    let mut global = None;
    if flags & 0x80 != 0 {
        let n = 3usize << ((flags & 7) + 1);
        let table = take(data, at, n)?;
        at += n;
        if palette_needed(table) {
            global = Some(table);
        }
    }
    let mut transparency = None;
    loop {
        match *data
            .get(at)
            .ok_or_else(|| err("truncated file: no image found"))?
        {
            b'!' => {
                let label = *data.get(at + 1).ok_or_else(|| err("truncated file"))?;
                let first = at + 2;
                if label == 0xF9 {
                    // Graphic control extension: first sub-block is 4 bytes.
                    let len = usize::from(*data.get(first).ok_or_else(|| err("truncated file"))?);
                    if len >= 4 {
                        let block = take(data, first + 1, len)?;
                        transparency = (block[0] & 1 != 0).then_some(block[3]);
                    }
                }
                at = skip_sub_blocks(data, first)?;
            }
            b',' => {
                let d = take(data, at + 1, 9)?;
                let (x0, y0) = (u16le(d, 0), u16le(d, 2));
                let (x1, y1) = (x0 + u16le(d, 4), y0 + u16le(d, 6));
                canvas = (canvas.0.max(x1), canvas.1.max(y1));
                let flags = d[8];
                at += 10;
                let mut palette = global;
                if flags & 0x80 != 0 {
                    let n = 3usize << ((flags & 7) + 1);
                    let table = take(data, at, n)?;
                    at += n;
                    palette = palette_needed(table).then_some(table);
                }
                let min_code_size = *data.get(at).ok_or_else(|| err("truncated file"))?;
                return Ok(FirstFrame {
                    canvas,
                    rect: (x0, y0, x1, y1),
                    interlaced: flags & 0x40 != 0,
                    palette,
                    transparency,
                    min_code_size,
                    data_at: at + 1,
                });
            }
            _ => return Err(err("no image found before the trailer")),
        }
    }
}

pub fn probe(data: &[u8], _limits: &Limits) -> Result<ImageInfo> {
    let f = first_frame(data)?;
    Ok(ImageInfo {
        format: Format::Gif,
        width: f.canvas.0,
        height: f.canvas.1,
        color_type: if f.palette.is_some() { "P" } else { "L" },
        orientation: 1,
    })
}

pub fn decode(
    data: &[u8],
    info: &ImageInfo,
    _limits: &Limits,
    target: Target,
    out: &mut [u8],
) -> Result<()> {
    let f = first_frame(data)?;
    let (cw, ch) = (info.width as usize, info.height as usize);
    let (x0, y0, x1, y1) = f.rect;
    let (fw, fh) = ((x1 - x0) as usize, (y1 - y0) as usize);
    let frame = lzw_frame(data, &f, fw * fh)?;
    let mut canvas = vec![f.transparency.unwrap_or(0); cw * ch];
    let rows: Vec<usize> = if f.interlaced {
        interlaced_rows(fh)
    } else {
        (0..fh).collect()
    };
    for (src_row, &dst_row) in frame.chunks_exact(fw.max(1)).zip(&rows) {
        let start = (y0 as usize + dst_row) * cw + x0 as usize;
        canvas[start..start + fw].copy_from_slice(&src_row[..fw]);
    }
    let raster = match f.palette {
        Some(palette) => {
            let mut alpha = [255u8; 256];
            if let Some(t) = f.transparency {
                alpha[usize::from(t)] = 0;
            }
            Raster::RgbKeyed(convert::depalette(&canvas, palette, &alpha))
        }
        None => match f.transparency {
            Some(t) => Raster::LKeyed(
                canvas
                    .iter()
                    .flat_map(|&v| [v, if v == t { 0 } else { 255 }])
                    .collect(),
            ),
            None => Raster::L(canvas),
        },
    };
    convert::write(&raster, target, out)
}

/// Row order of an interlaced GIF: passes of every 8th row from 0, every 8th
/// from 4, every 4th from 2, every 2nd from 1.
fn interlaced_rows(h: usize) -> Vec<usize> {
    [(0, 8), (4, 8), (2, 4), (1, 2)]
        .iter()
        .flat_map(|&(start, step)| (start..h).step_by(step))
        .collect()
}

/// Decodes exactly `pixels` indices; fewer is a truncated file.
fn lzw_frame(data: &[u8], f: &FirstFrame, pixels: usize) -> Result<Vec<u8>> {
    if f.min_code_size > 12 {
        return Err(err(format!(
            "invalid LZW minimum code size {}",
            f.min_code_size
        )));
    }
    let mut out = vec![0u8; pixels];
    let mut lzw = Lzw::new(BitOrder::Lsb, f.min_code_size);
    let mut filled = 0;
    let mut at = f.data_at;
    'blocks: loop {
        let n = usize::from(*data.get(at).ok_or_else(|| err("truncated image data"))?);
        at += 1;
        if n == 0 {
            break;
        }
        let mut block = take(data, at, n)?;
        at += n;
        while !block.is_empty() && filled < pixels {
            let r = lzw.decode_bytes(block, &mut out[filled..]);
            filled += r.consumed_out;
            block = &block[r.consumed_in..];
            match r.status {
                Ok(LzwStatus::Done) => break 'blocks,
                Ok(LzwStatus::NoProgress) if r.consumed_in == 0 && r.consumed_out == 0 => break,
                Ok(_) => {}
                Err(e) => return Err(err(format!("corrupt LZW data ({e})"))),
            }
        }
        if filled == pixels {
            break;
        }
    }
    // Input ends without an end code: an empty read flushes what the decoder holds.
    while filled < pixels {
        let r = lzw.decode_bytes(&[], &mut out[filled..]);
        filled += r.consumed_out;
        if r.consumed_out == 0 || r.status.is_err() {
            break;
        }
    }
    if filled < pixels {
        return Err(err(format!(
            "image data is truncated ({filled} of {pixels} pixels)"
        )));
    }
    Ok(out)
}
