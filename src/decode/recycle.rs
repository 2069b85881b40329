//! Large output buffers kept for the next decode.
//!
//! A decoded 4K image is 25 MB. When the caller drops it, glibc gives that
//! memory back to the kernel (an mmap'ed chunk is unmapped; a heap's top is
//! trimmed), and the next image of that size faults every page in again,
//! the kernel zero-filling each: 6,000 faults a 4K image, about a tenth of
//! its decode time, paid by every batch that `decode_many` returns whole and
//! by threads that drop each image alike. Buffers of [`MIN_BYTES`] or more
//! that outputs leave behind are parked here instead and handed to the next
//! output that fits, already faulted in.
//!
//! Bounded twice: at most [`cap`] bytes are parked (an eighth of physical
//! memory, 4 GiB at most), and a buffer parked for [`MAX_AGE`] is freed by a
//! reaper thread that runs only while something is parked, so a process that
//! stops decoding gives the memory back within seconds.
//!
//! A parked buffer holds an earlier image's pixels. It is only ever handed
//! out as a [`super::fresh::Fresh`] buffer, whose contract already treats
//! its bytes as unwritten: a decoder hands it on only after writing every
//! byte, or zero-fills it first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Smaller buffers are glibc's business: its free lists keep them mapped.
pub const MIN_BYTES: usize = 1 << 20;
/// How long a buffer waits to be used again before it is freed.
pub const MAX_AGE: Duration = Duration::from_secs(2);
/// A parked buffer serves an output of at least this share of its size, so
/// that a small image does not pin a large buffer.
const FIT_DIVISOR: usize = 2;
/// How often the reaper looks for buffers past their age.
const REAP_EVERY: Duration = Duration::from_millis(250);

struct Parked {
    buffers: VecDeque<(Instant, Vec<u8>)>,
    bytes: usize,
}

static PARKED: Mutex<Parked> = Mutex::new(Parked {
    buffers: VecDeque::new(),
    bytes: 0,
});
static REAPER_RUNNING: AtomicBool = AtomicBool::new(false);

/// Most bytes parked at once: an eighth of physical memory, at most 4 GiB.
pub fn cap() -> usize {
    static CAP: OnceLock<usize> = OnceLock::new();
    *CAP.get_or_init(|| {
        // SAFETY: sysconf only reads system configuration.
        let (pages, page) = unsafe {
            (
                libc::sysconf(libc::_SC_PHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let physical = usize::try_from(pages)
            .unwrap_or(0)
            .saturating_mul(usize::try_from(page).unwrap_or(0));
        (physical / 8).min(4 << 30)
    })
}

/// A parked buffer of capacity at least `len` (and at most `FIT_DIVISOR`
/// times it), emptied, or `None`.
pub(super) fn take(len: usize) -> Option<Vec<u8>> {
    if len < MIN_BYTES {
        return None;
    }
    let mut parked = PARKED.lock();
    let best = parked
        .buffers
        .iter()
        .enumerate()
        .filter(|(_, (_, b))| b.capacity() >= len && b.capacity() / FIT_DIVISOR <= len)
        .min_by_key(|(_, (_, b))| b.capacity())
        .map(|(i, _)| i)?;
    let (_, mut buf) = parked.buffers.remove(best)?;
    parked.bytes -= buf.capacity();
    // SAFETY: shrinking the length to 0 drops no initialisation claims.
    unsafe { buf.set_len(0) };
    Some(buf)
}

/// Parks `buf` for the next output that fits, or frees it when it is small
/// or the cap is reached (the oldest parked buffers make room first).
pub fn give_back(buf: Vec<u8>) {
    let size = buf.capacity();
    if size < MIN_BYTES || size > cap() {
        return;
    }
    let mut freed = Vec::new();
    {
        let mut parked = PARKED.lock();
        while parked.bytes + size > cap() {
            let Some((_, old)) = parked.buffers.pop_front() else {
                break;
            };
            parked.bytes -= old.capacity();
            freed.push(old);
        }
        parked.bytes += size;
        parked.buffers.push_back((Instant::now(), buf));
    }
    // Freed outside the lock: unmapping 25 MB takes a while.
    drop(freed);
    start_reaper();
}

/// Bytes parked now.
pub fn parked_bytes() -> usize {
    PARKED.lock().bytes
}

fn start_reaper() {
    if REAPER_RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let started = std::thread::Builder::new()
        .name("pixelwire-recycle".into())
        .spawn(reap);
    if started.is_err() {
        // No thread: free everything now rather than hold it unbounded in time.
        REAPER_RUNNING.store(false, Ordering::Release);
        let mut parked = PARKED.lock();
        parked.bytes = 0;
        let all = std::mem::take(&mut parked.buffers);
        drop(parked);
        drop(all);
    }
}

fn reap() {
    loop {
        std::thread::sleep(REAP_EVERY);
        let mut expired = Vec::new();
        let mut parked = PARKED.lock();
        while parked
            .buffers
            .front()
            .is_some_and(|(at, _)| at.elapsed() >= MAX_AGE)
        {
            let (_, old) = parked.buffers.pop_front().expect("checked above");
            parked.bytes -= old.capacity();
            expired.push(old);
        }
        if parked.buffers.is_empty() {
            // Cleared under the lock: a buffer parked after this starts a
            // new reaper.
            REAPER_RUNNING.store(false, Ordering::Release);
            drop(parked);
            drop(expired);
            return;
        }
        drop(parked);
        drop(expired);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parked buffers of exactly `capacity` bytes.
    fn parked_of(capacity: usize) -> usize {
        PARKED
            .lock()
            .buffers
            .iter()
            .filter(|(_, b)| b.capacity() == capacity)
            .count()
    }

    /// Other tests decode images beside this one and park their outputs too,
    /// so this one uses sizes no decode here makes (around 97 MiB), and
    /// buffers that are never written (capacity only).
    #[test]
    fn parked_buffers_fit_age_out_and_stay_bounded() {
        const UNIT: usize = (97 << 20) + 13;
        if cap() < 4 * UNIT {
            eprintln!(
                "skipped: this machine's cap ({} bytes) is below the test's sizes",
                cap()
            );
            return;
        }

        // A small buffer is not kept.
        give_back(Vec::with_capacity(MIN_BYTES - 1));
        assert_eq!(parked_of(MIN_BYTES - 1), 0);

        // A buffer comes back for an output it fits, emptied.
        let mut buf = Vec::<u8>::with_capacity(3 * UNIT);
        let ptr = buf.as_mut_ptr();
        give_back(buf);
        assert!(take(4 * UNIT).is_none(), "too small for the output");
        let again = take(2 * UNIT).expect("fits");
        assert_eq!((again.as_ptr(), again.len()), (ptr.cast_const(), 0));
        give_back(again);
        assert!(take(UNIT).is_none(), "too large for the output");

        // The cap holds however much comes back.
        for _ in 0..(cap() / UNIT + 2) {
            give_back(Vec::with_capacity(UNIT));
            assert!(parked_bytes() <= cap());
        }
        assert!(parked_of(UNIT) > 0);

        // What was parked is freed once it is older than MAX_AGE.
        let deadline = Instant::now() + MAX_AGE + Duration::from_secs(5);
        while parked_of(UNIT) + parked_of(3 * UNIT) > 0 && Instant::now() < deadline {
            std::thread::sleep(REAP_EVERY);
        }
        assert_eq!(parked_of(UNIT) + parked_of(3 * UNIT), 0);
    }
}
