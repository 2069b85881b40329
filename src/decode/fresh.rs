//! Output buffers that are not zero-filled first.
//!
//! `vec![0u8; n]` costs a full pass over the pixels whenever glibc hands
//! back a reused heap chunk (25 MB a 4K image, on every thread at once), and
//! the decoder overwrites all of it anyway. A [`Fresh`] buffer is allocated
//! but not initialised; it becomes a `Vec<u8>` only through
//! [`Fresh::assume_filled`], whose caller must show that the decoder wrote
//! every byte, or through [`Fresh::zeroed`], which pays for the fill.
//! Handing out bytes nobody wrote (possibly another image's pixels) is the
//! worst bug this crate can have, so each `assume_filled` states its proof.
//! Large buffers may come from [`super::recycle`], holding an earlier
//! image's pixels: the same contract covers them.

use std::mem::MaybeUninit;

/// From this size on, the buffer is asked to be backed by transparent huge
/// pages: a 4K RGB image is 12,000 4 KiB pages to fault in, or 12 huge ones.
const HUGE_PAGES_FROM: usize = 4 << 20;

pub(crate) struct Fresh {
    /// Capacity `len`, length 0 until filled.
    buf: Vec<u8>,
    len: usize,
}

impl Fresh {
    pub fn new(len: usize) -> Fresh {
        // A recycled buffer is already faulted in (and was advised before).
        let buf = super::recycle::take(len).unwrap_or_else(|| {
            let mut buf = Vec::with_capacity(len);
            if len >= HUGE_PAGES_FROM {
                advise_huge_pages(buf.as_mut_ptr(), len);
            }
            buf
        });
        #[cfg_attr(not(any(test, fuzzing)), allow(unused_mut))]
        let mut fresh = Fresh { buf, len };
        #[cfg(any(test, fuzzing))]
        poison::fill(fresh.as_uninit());
        fresh
    }

    /// Where a C decoder may write `len()` bytes.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr()
    }

    /// The buffer for Rust code that writes through `MaybeUninit`.
    pub fn as_uninit(&mut self) -> &mut [MaybeUninit<u8>] {
        &mut self.buf.spare_capacity_mut()[..self.len]
    }

    /// The buffer as written.
    ///
    /// # Safety
    /// Every one of the `len()` bytes has been written since [`Fresh::new`].
    pub unsafe fn assume_filled(mut self) -> Vec<u8> {
        // SAFETY: the capacity is at least `len` and the caller vouches that
        // all `len` bytes are initialised.
        unsafe { self.buf.set_len(self.len) };
        self.buf
    }

    /// Zero-filled, for a decoder that cannot be shown to write every byte.
    pub fn zeroed(mut self) -> Vec<u8> {
        self.buf.resize(self.len, 0);
        self.buf
    }
}

/// Asks for transparent huge pages on the 2 MiB-aligned part of a new
/// allocation. Only advice: a kernel without THP, or THP set to `never`,
/// ignores it, and glibc's own mapping stays its own to unmap.
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    let start = (ptr as usize).next_multiple_of(HUGE);
    let end = (ptr as usize + len) & !(HUGE - 1);
    if end > start {
        // SAFETY: [start, end) lies inside the allocation; MADV_HUGEPAGE
        // changes no contents and its failure is harmless.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// Test and fuzzing builds fill every new buffer with a chosen byte before
/// the decoder runs, so that a test can decode the same image over two
/// different fills and require the same result: an output byte the decoder
/// did not write would show up as a difference.
#[cfg(any(test, fuzzing))]
pub mod poison {
    use std::cell::Cell;
    use std::mem::MaybeUninit;

    thread_local! {
        static BYTE: Cell<u8> = const { Cell::new(0xA5) };
    }

    /// Sets the fill of this thread's next buffers.
    pub fn set(byte: u8) {
        BYTE.with(|b| b.set(byte));
    }

    pub(super) fn fill(buf: &mut [MaybeUninit<u8>]) {
        let byte = BYTE.with(|b| b.get());
        buf.fill(MaybeUninit::new(byte));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_is_zero_whatever_the_fill() {
        poison::set(0x5A);
        let z = Fresh::new(HUGE_PAGES_FROM + 3).zeroed();
        assert_eq!(z.len(), HUGE_PAGES_FROM + 3);
        assert!(z.iter().all(|&b| b == 0));
    }

    #[test]
    fn written_through_uninit() {
        let mut f = Fresh::new(5);
        f.as_uninit().fill(MaybeUninit::new(7));
        // SAFETY: all five bytes were written just above.
        assert_eq!(unsafe { f.assume_filled() }, vec![7; 5]);
    }
}
