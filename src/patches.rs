//! Processed inputs: an RGB image laid out as the patch rows a Qwen2-VL
//! style vision encoder takes (`pixel_values`), exactly as the model's
//! processor lays them out, so a worker hands them to the engine without
//! touching a pixel.
//!
//! The layout (transformers' `Qwen2VLImageProcessor`, torchvision backend,
//! with vLLM's device-side normalisation, which leaves the processor's
//! output as the resized image's own bytes): the image, `h x w` with both
//! sides multiples of `patch * merge`, is cut into `patch x patch` blocks;
//! rows run over the `merge x merge` windows in raster order, then over the
//! blocks inside a window in raster order. Each row holds channel-major
//! values, and within a channel the block repeated `temporal` times (an
//! image is one picture repeated along the temporal patch), each copy
//! row-major: `[C][T][P][P]`.

use crate::decode::{Fresh, Mode};
use crate::errors::{Error, Result};

/// The patch geometry of a processor: `patch_size`, `temporal_patch_size`
/// and `merge_size` of a Qwen2-VL image processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchGrid {
    pub patch: usize,
    pub temporal: usize,
    pub merge: usize,
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
    /// overflow (a processor's are 14 or 16, 2 and 2).
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
        })
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

    /// Bytes of the `u8` rows of an `height x width` image.
    pub fn bytes(&self, height: usize, width: usize) -> Result<usize> {
        let (rows, len) = self.shape(height, width)?;
        rows.checked_mul(len)
            .ok_or_else(|| Error::InvalidArgument("patch bytes overflow".into()))
    }

    /// Writes the `u8` rows of `rgb` (`height x width`, packed RGB) into
    /// `out`, which must be exactly [`PatchGrid::bytes`] long.
    pub fn write_u8(&self, rgb: &[u8], height: usize, width: usize, out: &mut [u8]) -> Result<()> {
        let expected = self.bytes(height, width)?;
        if rgb.len() != height * width * CHANNELS || out.len() != expected {
            return Err(Error::InvalidArgument(format!(
                "{} RGB bytes into {} patch bytes for a {height}x{width} image (want {} and {expected})",
                rgb.len(),
                out.len(),
                height * width * CHANNELS
            )));
        }
        let (p, m, t) = (self.patch, self.merge, self.temporal);
        let block = p * p;
        let stride = width * CHANNELS;
        let mut rows = out.chunks_exact_mut(self.row_len());
        for window_y in 0..height / (p * m) {
            for window_x in 0..width / (p * m) {
                for inner_y in 0..m {
                    for inner_x in 0..m {
                        let row = rows.next().expect("rows sized by shape()");
                        let top = (window_y * m + inner_y) * p;
                        let left = (window_x * m + inner_x) * p;
                        for c in 0..CHANNELS {
                            let first = &mut row[c * t * block..][..block];
                            for y in 0..p {
                                let line =
                                    &rgb[(top + y) * stride + left * CHANNELS..][..p * CHANNELS];
                                for (x, value) in first[y * p..][..p].iter_mut().enumerate() {
                                    *value = line[x * CHANNELS + c];
                                }
                            }
                            // The temporal copies of the block: the same picture.
                            let (first, rest) =
                                row[c * t * block..][..t * block].split_at_mut(block);
                            for copy in rest.chunks_exact_mut(block) {
                                copy.copy_from_slice(first);
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// `parts` joined one after the other into a new buffer: part `i` is rows
/// of `row_len` bytes, each row `CHANNELS` blocks of one picture, and lands
/// with every block repeated `copies` times (a processor's temporal copies
/// of an image, made from the one copy that travelled; 1: the rows as they
/// are). Every part must land as rows of one length.
pub fn join_rows(parts: &[(&[u8], usize, usize)]) -> Result<Vec<u8>> {
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
    let mut fresh = Fresh::new(total);
    let out = fresh.as_mut_ptr();
    let mut at = 0;
    for &(part, row_len, copies) in parts {
        let block = row_len / CHANNELS;
        for values in part.chunks_exact(block) {
            for _ in 0..copies {
                // SAFETY: `at + block <= total`: the blocks written add up
                // to `total` (each part's bytes times its copies), checked above.
                unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), out.add(at), block) };
                at += block;
            }
        }
    }
    debug_assert_eq!(at, total);
    // SAFETY: every byte of the `total` was written above, in order, once.
    Ok(unsafe { fresh.assume_filled() })
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
            g.write_u8(&rgb, h, w, &mut out).unwrap();
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
        once.write_u8(&rgb, h, w, &mut compact).unwrap();
        let mut full = vec![0u8; twice.bytes(h, w).unwrap()];
        twice.write_u8(&rgb, h, w, &mut full).unwrap();
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
    fn refuses_sides_off_the_merge_grid_and_wrong_buffers() {
        let g = PatchGrid::new(14, 2, 2).unwrap();
        assert!(g.shape(28, 42).is_err());
        assert!(g.shape(0, 28).is_err());
        let rgb = vec![0u8; 28 * 28 * 3];
        assert!(g.write_u8(&rgb, 28, 28, &mut [0u8; 10]).is_err());
        assert!(PatchGrid::new(0, 2, 2).is_err());
    }
}
