//! Processed inputs: an RGB image laid out as the patch rows a Qwen2-VL
//! style vision encoder takes (`pixel_values`), exactly as the model's
//! processor lays them out, so a worker hands them to the engine without
//! touching a pixel.
//!
//! The layout (transformers' `Qwen2VLImageProcessor`): the image, `h x w`
//! with both sides multiples of `patch * merge`, is cut into
//! `patch x patch` blocks; rows run over the `merge x merge` windows in
//! raster order, then over the blocks inside a window in raster order.
//! Each row holds channel-major values, and within a channel the block
//! repeated `temporal` times (an image is one picture repeated along the
//! temporal patch), each copy row-major: `[C][T][P][P]`.
//!
//! The values ([`Values`]): with vLLM's device-side normalisation the
//! processor's output is the resized image's own bytes (`u8`); without it,
//! the processor's `float32` normalised values, computed here with the
//! processor's own arithmetic, operation for operation ([`Normalise`]), so
//! the bits are the same.

use crate::decode::{Fresh, Mode};
use crate::errors::{Error, Result};

/// The patch geometry of a processor: `patch_size`, `temporal_patch_size`
/// and `merge_size` of a Qwen2-VL image processor, and the values its rows
/// hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PatchGrid {
    pub patch: usize,
    pub temporal: usize,
    pub merge: usize,
    pub values: Values,
}

/// What a row's values are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Values {
    /// The resized image's bytes (the processor with its rescale and
    /// normalisation off: vLLM's device-side normalisation).
    U8,
    /// The processor's normalised `float32` values, native-endian.
    F32(Normalise),
}

/// Which backend of transformers' image processor normalises, each with
/// its own arithmetic (transformers 5.19).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `TorchvisionBackend.rescale_and_normalize`: rescale fused into the
    /// normalisation, `mean * (1 / rescale)` and `std * (1 / rescale)` in
    /// `float32`, then torchvision's `normalize`: `(x - mean) / std`, each
    /// step rounded to `float32`.
    Torchvision,
    /// The PIL (numpy) backend: `rescale` multiplies in `float64` and
    /// rounds to `float32`, then `normalize` computes `(x - mean) / std` in
    /// `float32`.
    Pil,
}

/// A processor's rescale and normalisation (both on): its backend,
/// `image_mean`, `image_std` and `rescale_factor`, as its config gives them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Normalise {
    pub backend: Backend,
    pub mean: [f64; CHANNELS],
    pub std: [f64; CHANNELS],
    pub rescale: f64,
}

impl Normalise {
    /// Checked settings: finite, a positive rescale and standard deviations
    /// that are not zero in `float32` (the processor divides by them).
    pub fn new(backend: Backend, mean: [f64; 3], std: [f64; 3], rescale: f64) -> Result<Self> {
        let finite = mean.iter().chain(&std).all(|v| v.is_finite());
        let nonzero = std.iter().all(|&v| v as f32 != 0.0);
        if !(finite && nonzero && rescale.is_finite() && rescale > 0.0) {
            return Err(Error::InvalidArgument(format!(
                "normalisation mean {mean:?}, std {std:?}, rescale {rescale} must be finite, with std non-zero \
                 and rescale positive"
            )));
        }
        Ok(Self {
            backend,
            mean,
            std,
            rescale,
        })
    }

    /// The value of each byte in each channel, as the processor computes it.
    pub fn table(&self) -> [[f32; 256]; CHANNELS] {
        let mut table = [[0f32; 256]; CHANNELS];
        for (c, values) in table.iter_mut().enumerate() {
            let (mean, std) = (self.mean[c] as f32, self.std[c] as f32);
            match self.backend {
                Backend::Torchvision => {
                    // torch.tensor(mean) * (1.0 / rescale_factor): a float32
                    // tensor times a Python float, computed in float32.
                    let scale = (1.0 / self.rescale) as f32;
                    let (mean, std) = (mean * scale, std * scale);
                    for (x, value) in values.iter_mut().enumerate() {
                        *value = (x as f32 - mean) / std;
                    }
                }
                Backend::Pil => {
                    for (x, value) in values.iter_mut().enumerate() {
                        let rescaled = (x as f64 * self.rescale) as f32;
                        *value = (rescaled - mean) / std;
                    }
                }
            }
        }
        table
    }
}

/// RGB: the processors this layout serves take three channels.
const CHANNELS: usize = 3;

/// Patch rows are laid out from RGB pixels: an image decoded in another
/// mode is refused.
pub fn check_mode(mode: Mode) -> Result<()> {
    if mode == Mode::Rgb {
        return Ok(());
    }
    Err(Error::InvalidArgument(
        "patch rows need mode RGB".to_string(),
    ))
}

impl PatchGrid {
    /// A grid of positive sides, small enough that a row's length cannot
    /// overflow (a processor's are 14 or 16, 2 and 2), of `u8` rows.
    pub fn new(patch: usize, temporal: usize, merge: usize) -> Result<Self> {
        let ok = |v: usize| (1..=1024).contains(&v);
        if !(ok(patch) && ok(temporal) && ok(merge)) {
            return Err(Error::InvalidArgument(format!(
                "patch grid ({patch}, {temporal}, {merge}) must have each side 1 to 1024"
            )));
        }
        Ok(Self {
            patch,
            temporal,
            merge,
            values: Values::U8,
        })
    }

    /// The grid with rows of `values`.
    pub fn with_values(self, values: Values) -> Self {
        Self { values, ..self }
    }

    /// Bytes a value takes: 1 (`u8`) or 4 (`f32`).
    pub fn value_bytes(&self) -> usize {
        match self.values {
            Values::U8 => 1,
            Values::F32(_) => 4,
        }
    }

    /// Values in one row: `C * T * P * P`.
    pub fn row_len(&self) -> usize {
        CHANNELS * self.temporal * self.patch * self.patch
    }

    /// `(rows, row_len)` of an `height x width` image, whose sides must be
    /// multiples of `patch * merge` (the processor's resize makes them so).
    pub fn shape(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        let factor = self.patch * self.merge;
        if height == 0
            || width == 0
            || !height.is_multiple_of(factor)
            || !width.is_multiple_of(factor)
        {
            return Err(Error::InvalidArgument(format!(
                "a {height}x{width} image does not divide into {factor}-pixel merge windows"
            )));
        }
        let rows = (height / self.patch)
            .checked_mul(width / self.patch)
            .ok_or_else(|| Error::InvalidArgument("patch count overflows".into()))?;
        Ok((rows, self.row_len()))
    }

    /// Bytes of the rows of an `height x width` image.
    pub fn bytes(&self, height: usize, width: usize) -> Result<usize> {
        let (rows, len) = self.shape(height, width)?;
        rows.checked_mul(len)
            .and_then(|n| n.checked_mul(self.value_bytes()))
            .ok_or_else(|| Error::InvalidArgument("patch bytes overflow".into()))
    }

    /// Writes the rows of `rgb` (`height x width`, packed RGB) into `out`,
    /// which must be exactly [`PatchGrid::bytes`] long: the bytes
    /// themselves, or each byte's normalised `f32`, native-endian ([`Values`]).
    pub fn write(&self, rgb: &[u8], height: usize, width: usize, out: &mut [u8]) -> Result<()> {
        match self.values {
            Values::U8 => self.lay_out(rgb, height, width, out, |value, byte, _| value[0] = byte),
            Values::F32(normalise) => {
                let table = normalise.table();
                self.lay_out(rgb, height, width, out, |value, byte, c| {
                    value.copy_from_slice(&table[c][byte as usize].to_ne_bytes())
                })
            }
        }
    }

    /// Checks the sizes, then lays the one picture out as a group of one
    /// frame: its temporal copies are copied from the first.
    fn lay_out(
        &self,
        rgb: &[u8],
        height: usize,
        width: usize,
        out: &mut [u8],
        put: impl Fn(&mut [u8], u8, usize),
    ) -> Result<()> {
        let expected = self.bytes(height, width)?;
        if rgb.len() != height * width * CHANNELS || out.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "{} RGB bytes into {} patch bytes for a {height}x{width} image (want {} and {expected})",
                rgb.len(),
                out.len(),
                height * width * CHANNELS
            )));
        }
        self.lay_out_frames(&[rgb], width, out, put);
        Ok(())
    }
}

impl PatchGrid {
    /// Bytes of the rows of a video of `frames` frames of `height x width`:
    /// one image's rows a group of `temporal` frames, the last group filled
    /// (see [`PatchGrid::write_video`]).
    pub fn video_bytes(&self, frames: usize, height: usize, width: usize) -> Result<usize> {
        if frames == 0 {
            return Err(Error::InvalidArgument(
                "a video of no frames has no patch rows".into(),
            ));
        }
        self.bytes(height, width)?
            .checked_mul(frames.div_ceil(self.temporal))
            .ok_or_else(|| Error::InvalidArgument("patch bytes overflow".into()))
    }

    /// Writes the rows of a video's processor (transformers'
    /// `Qwen2VLVideoProcessor` and `Qwen3VLVideoProcessor`) into `out`,
    /// exactly [`PatchGrid::video_bytes`] long: `video` is `frames` packed
    /// RGB frames of `height x width`, one after the other; each group of
    /// `temporal` consecutive frames is laid out as an image's rows, with
    /// frame `t` of the group in the block's `t`-th temporal slot (where an
    /// image repeats itself), and the last group filled by repeating the
    /// last frame, as the processor pads it.
    pub fn write_video(
        &self,
        video: &[u8],
        frames: usize,
        height: usize,
        width: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let expected = self.video_bytes(frames, height, width)?;
        let frame_len = height * width * CHANNELS;
        if video.len() != frames * frame_len || out.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "{} RGB bytes into {} patch bytes for {frames} frames of {height}x{width} (want {} and \
                 {expected})",
                video.len(),
                out.len(),
                frames * frame_len
            )));
        }
        let group_bytes = expected / frames.div_ceil(self.temporal);
        for (g, group) in out.chunks_exact_mut(group_bytes).enumerate() {
            // The last group's missing frames are its last frame again:
            // lay_out_frames copies it into their slots.
            let first = g * self.temporal;
            let slots: Vec<&[u8]> = (first..(first + self.temporal).min(frames))
                .map(|index| &video[index * frame_len..][..frame_len])
                .collect();
            match self.values {
                Values::U8 => {
                    self.lay_out_frames(&slots, width, group, |value, byte, _| value[0] = byte)
                }
                Values::F32(normalise) => {
                    let table = normalise.table();
                    self.lay_out_frames(&slots, width, group, |value, byte, c| {
                        value.copy_from_slice(&table[c][byte as usize].to_ne_bytes())
                    })
                }
            }
        }
        Ok(())
    }

    /// One group's rows: `slots[t]` (packed RGB of `width`-pixel lines)
    /// into temporal slot `t` of every block, `put(value, byte, channel)`
    /// writing each value (`value` is [`PatchGrid::value_bytes`] long), and
    /// the slots past the pictures given copied from the last one (an
    /// image's temporal copies of itself; a video's last group, padded as
    /// the processor pads it). Sizes checked by the caller.
    fn lay_out_frames(
        &self,
        slots: &[&[u8]],
        width: usize,
        out: &mut [u8],
        put: impl Fn(&mut [u8], u8, usize),
    ) {
        let (p, m, t, size) = (self.patch, self.merge, self.temporal, self.value_bytes());
        let block = p * p * size;
        let stride = width * CHANNELS;
        let height = slots[0].len() / stride;
        let mut rows = out.chunks_exact_mut(self.row_len() * size);
        for window_y in 0..height / (p * m) {
            for window_x in 0..width / (p * m) {
                for inner_y in 0..m {
                    for inner_x in 0..m {
                        let row = rows.next().expect("rows sized by the caller");
                        let top = (window_y * m + inner_y) * p;
                        let left = (window_x * m + inner_x) * p;
                        for c in 0..CHANNELS {
                            let blocks = &mut row[c * t * block..][..t * block];
                            for (slot, rgb) in slots.iter().enumerate() {
                                let values = &mut blocks[slot * block..][..block];
                                for y in 0..p {
                                    let line = &rgb[(top + y) * stride + left * CHANNELS..]
                                        [..p * CHANNELS];
                                    let cells =
                                        values[y * p * size..][..p * size].chunks_exact_mut(size);
                                    for (x, value) in cells.enumerate() {
                                        put(value, line[x * CHANNELS + c], c);
                                    }
                                }
                            }
                            let (given, rest) = blocks.split_at_mut(slots.len() * block);
                            let last = &given[(slots.len() - 1) * block..];
                            for copy in rest.chunks_exact_mut(block) {
                                copy.copy_from_slice(last);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `parts` joined one after the other into a new buffer: part `i` is rows
/// of `row_len` bytes, each row `CHANNELS` blocks of one picture, and lands
/// with every block repeated `copies` times (a processor's temporal copies
/// of an image, made from the one copy that travelled; 1: the rows as they
/// are). Every part must land as rows of one length.
pub fn join_rows(parts: &[(&[u8], usize, usize)]) -> Result<Vec<u8>> {
    let total = joined_bytes(parts)?;
    let mut fresh = Fresh::new(total);
    let out = fresh.as_mut_ptr();
    let mut at = 0;
    for &(part, row_len, copies) in parts {
        let block = row_len / CHANNELS;
        for values in part.chunks_exact(block) {
            for _ in 0..copies {
                // SAFETY: `at + block <= total`: the blocks written add up
                // to `total` (each part's bytes times its copies), checked
                // by `joined_bytes`.
                unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), out.add(at), block) };
                at += block;
            }
        }
    }
    debug_assert_eq!(at, total);
    // SAFETY: every byte of the `total` was written above, in order, once.
    Ok(unsafe { fresh.assume_filled() })
}

/// [`join_rows`] of `u8` rows landing as the processor's normalised
/// `float32` values (`normalise`, native-endian, four bytes a value): the
/// float rows of rows that travelled as the image's bytes, made in the one
/// pass that makes their temporal copies.
pub fn join_rows_normalised(
    parts: &[(&[u8], usize, usize)],
    normalise: &Normalise,
) -> Result<Vec<u8>> {
    let total = joined_bytes(parts)?
        .checked_mul(4)
        .ok_or_else(|| Error::InvalidArgument("patch rows overflow".into()))?;
    let table = normalise.table();
    let mut fresh = Fresh::new(total);
    let out = fresh.as_mut_ptr();
    let mut at = 0;
    for &(part, row_len, copies) in parts {
        let block = row_len / CHANNELS;
        // A row is CHANNELS blocks, one a channel, in order.
        for (index, bytes) in part.chunks_exact(block).enumerate() {
            let channel = &table[index % CHANNELS];
            let first = at;
            for &byte in bytes {
                let value = channel[byte as usize].to_ne_bytes();
                // SAFETY: `at + 4 <= total`: four bytes for each byte of
                // each part times its copies, checked above.
                unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), out.add(at), 4) };
                at += 4;
            }
            for _ in 1..copies {
                // SAFETY: the block's first copy, written just above, does
                // not overlap this one, which fits in `total` as above.
                unsafe { std::ptr::copy_nonoverlapping(out.add(first), out.add(at), block * 4) };
                at += block * 4;
            }
        }
    }
    debug_assert_eq!(at, total);
    // SAFETY: every byte of the `total` was written above, in order, once.
    Ok(unsafe { fresh.assume_filled() })
}

/// The bytes `parts` join into (each part's bytes times its copies),
/// checked: whole rows of a length that splits into `CHANNELS` blocks, at
/// least one copy, and every part landing at one row length.
fn joined_bytes(parts: &[(&[u8], usize, usize)]) -> Result<usize> {
    let mut landed_len = None;
    let mut total = 0usize;
    for &(part, row_len, copies) in parts {
        let ok = row_len > 0 && row_len.is_multiple_of(CHANNELS) && copies > 0;
        let landed = row_len.checked_mul(copies);
        let size = part.len().checked_mul(copies);
        let fits = landed_len.is_none() || landed_len == landed;
        if !ok
            || !part.len().is_multiple_of(row_len.max(1))
            || landed.is_none()
            || size.is_none()
            || !fits
        {
            return Err(Error::InvalidArgument(format!(
                "patch rows of {row_len} bytes copied {copies} times do not join the others"
            )));
        }
        landed_len = landed;
        total = total
            .checked_add(size.unwrap_or(0))
            .ok_or_else(|| Error::InvalidArgument("patch rows overflow".into()))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout spelled out as the processor's reshape and permute do it,
    /// index by index: the reference the fast path is checked against.
    fn reference(rgb: &[u8], h: usize, w: usize, g: PatchGrid) -> Vec<u8> {
        let (p, m, t) = (g.patch, g.merge, g.temporal);
        let mut out = Vec::new();
        for wy in 0..h / (p * m) {
            for wx in 0..w / (p * m) {
                for iy in 0..m {
                    for ix in 0..m {
                        for c in 0..3 {
                            for _ in 0..t {
                                for py in 0..p {
                                    for px in 0..p {
                                        let y = (wy * m + iy) * p + py;
                                        let x = (wx * m + ix) * p + px;
                                        out.push(rgb[(y * w + x) * 3 + c]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_index_by_index_layout() {
        for (h, w, g) in [
            (28, 56, PatchGrid::new(14, 2, 2).unwrap()),
            (64, 32, PatchGrid::new(16, 2, 2).unwrap()),
            (6, 9, PatchGrid::new(3, 3, 1).unwrap()),
        ] {
            let rgb: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 + i / 5) as u8).collect();
            let mut out = vec![0u8; g.bytes(h, w).unwrap()];
            g.write(&rgb, h, w, &mut out).unwrap();
            assert_eq!(out, reference(&rgb, h, w, g), "{h}x{w} {g:?}");
        }
    }

    #[test]
    fn joined_rows_are_the_rows_laid_out_with_their_copies() {
        let (h, w) = (28, 56);
        let rgb: Vec<u8> = (0..h * w * 3).map(|i| (i * 13 + i / 7) as u8).collect();
        let (once, twice) = (
            PatchGrid::new(14, 1, 2).unwrap(),
            PatchGrid::new(14, 2, 2).unwrap(),
        );
        let mut compact = vec![0u8; once.bytes(h, w).unwrap()];
        once.write(&rgb, h, w, &mut compact).unwrap();
        let mut full = vec![0u8; twice.bytes(h, w).unwrap()];
        twice.write(&rgb, h, w, &mut full).unwrap();
        // A compact part copied twice, then a full part as it is.
        let out = join_rows(&[(&compact, once.row_len(), 2), (&full, twice.row_len(), 1)]).unwrap();
        assert_eq!(out.len(), full.len() * 2);
        assert_eq!(&out[..full.len()], &full[..]);
        assert_eq!(&out[full.len()..], &full[..]);
        // Rows that would land at another length, or are not whole rows.
        assert!(join_rows(&[(&compact, once.row_len(), 1), (&full, twice.row_len(), 1)]).is_err());
        assert!(join_rows(&[(&compact[..10], once.row_len(), 2)]).is_err());
        assert!(join_rows(&[(&compact, 10, 2)]).is_err());
        assert!(join_rows(&[(&compact, once.row_len(), 0)]).is_err());
    }

    #[test]
    fn float_rows_are_the_u8_rows_through_the_processors_arithmetic() {
        let (h, w) = (64, 32);
        let rgb: Vec<u8> = (0..h * w * 3).map(|i| (i * 7 + i / 5) as u8).collect();
        let grid = PatchGrid::new(16, 2, 2).unwrap();
        let mut bytes = vec![0u8; grid.bytes(h, w).unwrap()];
        grid.write(&rgb, h, w, &mut bytes).unwrap();
        let (mean, std) = (
            [0.48145466, 0.4578275, 0.40821073],
            [0.26862954, 0.26130258, 0.27577711],
        );
        for backend in [Backend::Torchvision, Backend::Pil] {
            let normalise = Normalise::new(backend, mean, std, 1.0 / 255.0).unwrap();
            let floats = grid.with_values(Values::F32(normalise));
            let mut out = vec![0u8; floats.bytes(h, w).unwrap()];
            assert_eq!(out.len(), bytes.len() * 4);
            floats.write(&rgb, h, w, &mut out).unwrap();
            let row_len = grid.row_len();
            for (i, (&x, value)) in bytes.iter().zip(out.chunks_exact(4)).enumerate() {
                let c = i % row_len / (row_len / 3);
                let (m, s) = (mean[c] as f32, std[c] as f32);
                let want = match backend {
                    Backend::Torchvision => (x as f32 - m * 255.0) / (s * 255.0),
                    Backend::Pil => ((x as f64 / 255.0) as f32 - m) / s,
                };
                assert_eq!(
                    f32::from_ne_bytes(value.try_into().unwrap()).to_bits(),
                    want.to_bits()
                );
            }
        }
        assert!(Normalise::new(Backend::Pil, mean, [0.5, 0.0, 0.5], 1.0 / 255.0).is_err());
        assert!(Normalise::new(Backend::Pil, mean, std, 0.0).is_err());
        assert!(Normalise::new(Backend::Pil, [f64::NAN, 0.0, 0.0], std, 1.0).is_err());
    }

    #[test]
    fn normalised_joins_are_the_float_rows_laid_out() {
        let (h, w) = (28, 56);
        let rgb: Vec<u8> = (0..h * w * 3).map(|i| (i * 11 + i / 3) as u8).collect();
        let normalise = Normalise::new(
            Backend::Torchvision,
            [0.48145466, 0.4578275, 0.40821073],
            [0.26862954, 0.26130258, 0.27577711],
            1.0 / 255.0,
        )
        .unwrap();
        let once = PatchGrid::new(14, 1, 2).unwrap();
        let mut compact = vec![0u8; once.bytes(h, w).unwrap()];
        once.write(&rgb, h, w, &mut compact).unwrap();
        let floats = PatchGrid::new(14, 2, 2)
            .unwrap()
            .with_values(Values::F32(normalise));
        let mut want = vec![0u8; floats.bytes(h, w).unwrap()];
        floats.write(&rgb, h, w, &mut want).unwrap();
        // The compact u8 rows, twice over: the image's float rows, twice.
        let part = (&compact[..], once.row_len(), 2);
        let out = join_rows_normalised(&[part, part], &normalise).unwrap();
        assert_eq!(out.len(), want.len() * 2);
        assert_eq!(&out[..want.len()], &want[..]);
        assert_eq!(&out[want.len()..], &want[..]);
        assert!(join_rows_normalised(&[(&compact[..10], once.row_len(), 2)], &normalise).is_err());
    }

    #[test]
    fn video_rows_are_each_groups_frames_in_their_temporal_slots() {
        // 3 frames, temporal 2: the second group is frame 2 twice.
        let g = PatchGrid::new(2, 2, 2).unwrap();
        let (h, w, frames) = (4, 8, 3);
        let video: Vec<u8> = (0..frames * h * w * 3)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut out = vec![0u8; g.video_bytes(frames, h, w).unwrap()];
        g.write_video(&video, frames, h, w, &mut out).unwrap();
        let frame = |i: usize| &video[i * h * w * 3..][..h * w * 3];
        let one = PatchGrid::new(2, 1, 2).unwrap();
        let single = |i: usize| reference(frame(i), h, w, one);
        let (rows, len) = one.shape(h, w).unwrap();
        let block = len / 3;
        for (group, pair) in [(0, [0, 1]), (1, [2, 2])] {
            for r in 0..rows {
                for c in 0..3 {
                    for (slot, &f) in pair.iter().enumerate() {
                        let got =
                            &out[(group * rows + r) * len * 2 + (c * 2 + slot) * block..][..block];
                        assert_eq!(got, &single(f)[r * len + c * block..][..block]);
                    }
                }
            }
        }
        assert!(g.write_video(&video, frames, h, w, &mut out[1..]).is_err());
        assert!(g.video_bytes(0, h, w).is_err());
    }

    #[test]
    fn refuses_sides_off_the_merge_grid_and_wrong_buffers() {
        let g = PatchGrid::new(14, 2, 2).unwrap();
        assert!(g.shape(28, 42).is_err());
        assert!(g.shape(0, 28).is_err());
        let rgb = vec![0u8; 28 * 28 * 3];
        assert!(g.write(&rgb, 28, 28, &mut [0u8; 10]).is_err());
        assert!(PatchGrid::new(0, 2, 2).is_err());
    }
}
