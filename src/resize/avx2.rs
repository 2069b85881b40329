//! AVX2 passes of the resize: the same integer arithmetic as the scalar
//! passes in `resize.rs` (i32 products and wrapping i32 sums), so both give
//! the same bytes.

use super::Coeffs;
use std::arch::x86_64::*;

/// Expanded pairwise weights for the 3/4-channel horizontal kernel:
/// per output x and tap pair p: [w(2p) x4, w(2p+1) x4].
pub fn expand_pairs(co: &Coeffs) -> (Vec<i32>, usize) {
    let pairs = co.stride / 2;
    let mut out = vec![0i32; co.bounds.len() * pairs * 8];
    for x in 0..co.bounds.len() {
        let k = &co.weights[x * co.stride..][..co.stride];
        for p in 0..pairs {
            let o = &mut out[(x * pairs + p) * 8..][..8];
            o[..4].fill(k[2 * p]);
            o[4..].fill(k[2 * p + 1]);
        }
    }
    (out, pairs)
}

#[inline(always)]
unsafe fn store_px<const C: usize>(dst: *mut u8, v: __m128i) {
    let b = _mm_cvtsi128_si32(v) as u32;
    if C == 4 {
        (dst as *mut u32).write_unaligned(b);
    } else {
        let bytes = b.to_le_bytes();
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, 3);
    }
}

#[inline(always)]
unsafe fn reduce_pack(acc: __m256i, shift: __m128i) -> __m128i {
    let s = _mm_add_epi32(
        _mm256_castsi256_si128(acc),
        _mm256_extracti128_si256(acc, 1),
    );
    let s = _mm_sra_epi32(s, shift);
    let s = _mm_packs_epi32(s, s);
    _mm_packus_epi16(s, s)
}

/// Horizontal pass of two rows (ra may equal rb) for 3 or 4 byte pixels.
/// Safety: each row pointer must have at least `w_in*C + 8` readable bytes.
#[target_feature(enable = "avx2")]
pub unsafe fn hrow2_c34<const C: usize>(
    ra: *const u8,
    rb: *const u8,
    oa: *mut u8,
    ob: *mut u8,
    co: &Coeffs,
    wexp: &[i32],
    pairs: usize,
) {
    let half = 1i32 << (co.shift - 1);
    let init = _mm256_setr_epi32(half, half, half, half, 0, 0, 0, 0);
    let shift = _mm_cvtsi32_si128(co.shift as i32);
    let mask = _mm_setr_epi8(0, 1, 2, -128, 3, 4, 5, -128, 0, 0, 0, 0, 0, 0, 0, 0);
    for (x, &(xmin, n)) in co.bounds.iter().enumerate() {
        let np = (n as usize).div_ceil(2);
        let wp = wexp.as_ptr().add(x * pairs * 8);
        let mut acc_a = init;
        let mut acc_b = init;
        let mut pa = ra.add(xmin as usize * C);
        let mut pb = rb.add(xmin as usize * C);
        for p in 0..np {
            let wv = _mm256_loadu_si256(wp.add(p * 8) as *const __m256i);
            let mut la = _mm_loadl_epi64(pa as *const __m128i);
            let mut lb = _mm_loadl_epi64(pb as *const __m128i);
            if C == 3 {
                la = _mm_shuffle_epi8(la, mask);
                lb = _mm_shuffle_epi8(lb, mask);
            }
            acc_a = _mm256_add_epi32(acc_a, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(la), wv));
            acc_b = _mm256_add_epi32(acc_b, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(lb), wv));
            pa = pa.add(2 * C);
            pb = pb.add(2 * C);
        }
        store_px::<C>(oa.add(x * C), reduce_pack(acc_a, shift));
        store_px::<C>(ob.add(x * C), reduce_pack(acc_b, shift));
    }
}

/// Horizontal pass of one single-channel row.
/// Safety: `row` must have at least `w_in + 8` readable bytes.
#[target_feature(enable = "avx2")]
pub unsafe fn hrow_c1(row: *const u8, out: *mut u8, co: &Coeffs) {
    let half = 1i32 << (co.shift - 1);
    for (x, &(xmin, n)) in co.bounds.iter().enumerate() {
        let k = co.weights.as_ptr().add(x * co.stride);
        let mut acc = _mm256_setzero_si256();
        let mut t = 0usize;
        while t < n as usize {
            let px =
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(row.add(xmin as usize + t) as *const __m128i));
            let wv = _mm256_loadu_si256(k.add(t) as *const __m256i);
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, wv));
            t += 8;
        }
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(acc),
            _mm256_extracti128_si256(acc, 1),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
        let total = half.wrapping_add(_mm_cvtsi128_si32(s));
        *out.add(x) = super::finish(total, co.shift);
    }
}

/// Vertical pass for one output row; returns the number of bytes done (multiple of 32).
#[target_feature(enable = "avx2")]
pub unsafe fn vrow(tmp: &[u8], row_len: usize, y: usize, co: &Coeffs, dst: &mut [u8]) -> usize {
    let (ymin, n) = co.bounds[y];
    let k = &co.weights[y * co.stride..][..n as usize];
    let half = _mm256_set1_epi32(1i32 << (co.shift - 1));
    let shift = _mm_cvtsi32_si128(co.shift as i32);
    let base = tmp.as_ptr().add(ymin as usize * row_len);
    let mut off = 0usize;
    while off + 32 <= row_len {
        let mut a0 = half;
        let mut a1 = half;
        let mut a2 = half;
        let mut a3 = half;
        let mut p = base.add(off);
        for &w in k {
            let wv = _mm256_set1_epi32(w);
            let v = _mm256_loadu_si256(p as *const __m256i);
            let lo = _mm256_castsi256_si128(v);
            let hi = _mm256_extracti128_si256(v, 1);
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(lo), wv));
            a1 = _mm256_add_epi32(
                a1,
                _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)), wv),
            );
            a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(hi), wv));
            a3 = _mm256_add_epi32(
                a3,
                _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)), wv),
            );
            p = p.add(row_len);
        }
        a0 = _mm256_sra_epi32(a0, shift);
        a1 = _mm256_sra_epi32(a1, shift);
        a2 = _mm256_sra_epi32(a2, shift);
        a3 = _mm256_sra_epi32(a3, shift);
        let p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(a0, a1), 0b11_01_10_00);
        let p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(a2, a3), 0b11_01_10_00);
        let r = _mm256_permute4x64_epi64(_mm256_packus_epi16(p01, p23), 0b11_01_10_00);
        _mm256_storeu_si256(dst.as_mut_ptr().add(off) as *mut __m256i, r);
        off += 32;
    }
    off
}
