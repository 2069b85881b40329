//! Many images at once on a native thread pool: `decode_many`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::{decode_resized, probe, resized_shape, DecodeOptions, OutputShape};
use crate::errors::{Error, Result};

/// Most threads one pool may have: more than any machine's cores today, and
/// a bound on what one call can make the process start.
pub const MAX_THREADS: usize = 1024;

/// Pools kept for reuse, by size: starting threads for every call would cost
/// more than a small image's decode, and a caller naming many sizes must not
/// grow the process without bound.
const KEPT_POOLS: usize = 4;

/// A pool's thread count: `threads`, checked, or every core when `None`.
pub fn thread_count(threads: Option<usize>) -> Result<usize> {
    match threads {
        Some(n) if n == 0 || n > MAX_THREADS => Err(Error::InvalidArgument(format!(
            "threads must be between 1 and {MAX_THREADS}, not {n}"
        ))),
        Some(n) => Ok(n),
        None => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
    }
}

/// The pool of `threads` threads (all cores when `None`), made on first use
/// and kept for the next calls.
pub fn thread_pool(threads: Option<usize>) -> Result<Arc<rayon::ThreadPool>> {
    static POOLS: Mutex<VecDeque<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(VecDeque::new());
    let threads = thread_count(threads)?;
    let mut pools = POOLS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, pool)) = pools.iter().find(|(n, _)| *n == threads) {
        return Ok(Arc::clone(pool));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("pixelwire-decode-{i}"))
        .build()
        .map_err(|e| Error::InvalidArgument(format!("could not start {threads} threads: {e}")))?;
    let pool = Arc::new(pool);
    if pools.len() == KEPT_POOLS {
        // Its threads end once the calls still using it are done.
        pools.pop_front();
    }
    pools.push_back((threads, Arc::clone(&pool)));
    Ok(pool)
}

/// One image of a batch: its output shape and its pixels.
pub type Decoded = (OutputShape, Vec<u8>);

/// Decodes every input with the same options on `pool`, results in input
/// order. Fails with the error of the lowest-numbered input that fails, as
/// [`Error::Batch`]; once one input has failed, inputs after it are skipped
/// (those before it are still decoded, so the one reported is the first
/// failure whatever the scheduling).
///
/// Scheduling: one worker per image up to the pool's size is started at
/// once, and each takes the next image from one shared cursor until none
/// is left, as threads pulling from one queue do; the images go largest
/// (in encoded bytes) first, so that a large one is not the last to start
/// while the other threads have finished. An image range is never parked
/// in one busy worker's deque (rayon's recursive split, where a range
/// waits there until another thread steals it or the owner has finished
/// its image). A batch of one image is decoded on the calling thread.
pub fn decode_many(
    pool: &rayon::ThreadPool,
    inputs: &[&[u8]],
    opts: &DecodeOptions,
    resize: Option<&crate::resize::Target>,
) -> Result<Vec<Decoded>> {
    let first_failure = AtomicUsize::new(usize::MAX);
    let decode_one = |index: usize| -> Option<Result<Decoded>> {
        if index > first_failure.load(Ordering::Relaxed) {
            return None;
        }
        let data = inputs[index];
        let outcome = probe(data, &opts.limits).and_then(|info| {
            let shape = resized_shape(info.output_shape(opts), resize);
            decode_resized(data, &info, opts, resize).map(|pixels| (shape, pixels))
        });
        if outcome.is_err() {
            first_failure.fetch_min(index, Ordering::Relaxed);
        }
        Some(outcome)
    };
    let slots: Vec<OnceLock<Option<Result<Decoded>>>> =
        inputs.iter().map(|_| OnceLock::new()).collect();
    if inputs.len() == 1 {
        // No thread hop for one image: this thread waits for it anyway.
        let _ = slots[0].set(decode_one(0));
    } else {
        let order = largest_first(inputs);
        let next = AtomicUsize::new(0);
        let work = || {
            while let Some(&index) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                let _ = slots[index].set(decode_one(index));
            }
        };
        let workers = inputs.len().min(pool.current_num_threads());
        pool.in_place_scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|_| work());
            }
        });
    }
    let mut decoded = Vec::with_capacity(inputs.len());
    for (index, slot) in slots.into_iter().enumerate() {
        match slot.into_inner() {
            Some(Some(Ok(image))) => decoded.push(image),
            Some(Some(Err(error))) => {
                return Err(Error::Batch {
                    index,
                    error: Box::new(error),
                })
            }
            // Skipped inputs come after a failed one, which returned above;
            // every input is taken by a worker before the scope ends.
            Some(None) | None => {
                unreachable!("an input is skipped only after an earlier one failed")
            }
        }
    }
    Ok(decoded)
}

/// Input indices, the longest input first (ties in input order): encoded
/// size is the decode cost known without reading a header.
fn largest_first(inputs: &[&[u8]]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..inputs.len()).collect();
    order.sort_by_key(|&index| std::cmp::Reverse(inputs[index].len()));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2x1 grey PGM (the smallest image any decoder here reads).
    const TINY: &[u8] = b"P5 2 1 255\n\x10\x20";

    #[test]
    fn results_in_order_and_the_first_failure_named() {
        let pool = thread_pool(Some(3)).unwrap();
        let opts = DecodeOptions::default();
        let wide = b"P5 3 1 255\n\x01\x02\x03";
        let inputs: Vec<&[u8]> = vec![TINY, wide, TINY, wide];
        let out = decode_many(&pool, &inputs, &opts, None).unwrap();
        let widths: Vec<usize> = out.iter().map(|(shape, _)| shape.width).collect();
        assert_eq!(widths, [2, 3, 2, 3]);

        // Whatever the scheduling, the lowest failing index is reported.
        let mut inputs: Vec<&[u8]> = vec![TINY; 64];
        inputs[40] = b"junk";
        inputs[7] = b"more junk";
        for _ in 0..20 {
            match decode_many(&pool, &inputs, &opts, None) {
                Err(Error::Batch { index, error }) => {
                    assert_eq!(index, 7);
                    assert!(matches!(*error, Error::UnsupportedFormat(_)));
                }
                other => panic!("expected a batch error, got {other:?}"),
            }
        }
    }

    #[test]
    fn largest_inputs_go_first_ties_in_input_order() {
        let inputs: Vec<&[u8]> = vec![b"ab", b"abcd", b"a", b"abcd", b"abc"];
        assert_eq!(largest_first(&inputs), [1, 3, 4, 0, 2]);
    }

    #[test]
    fn batches_smaller_and_larger_than_the_pool() {
        let pool = thread_pool(Some(4)).unwrap();
        let opts = DecodeOptions::default();
        let wide = b"P5 3 1 255\n\x01\x02\x03";
        // One image (decoded on this thread), fewer images than threads, and
        // many more: each comes back in its place with its own pixels.
        for count in [1, 2, 3, 4, 5, 37] {
            let inputs: Vec<&[u8]> = (0..count)
                .map(|i| if i % 3 == 1 { &wide[..] } else { TINY })
                .collect();
            let out = decode_many(&pool, &inputs, &opts, None).unwrap();
            assert_eq!(out.len(), count);
            for (data, (shape, pixels)) in inputs.iter().zip(&out) {
                let info = probe(data, &opts.limits).unwrap();
                let alone = decode_resized(data, &info, &opts, None).unwrap();
                assert_eq!(shape.width, info.width as usize);
                assert_eq!(pixels, &alone);
            }
        }
        // A failing single image is named as the batch's image 0.
        match decode_many(&pool, &[b"junk"], &opts, None) {
            Err(Error::Batch { index: 0, .. }) => {}
            other => panic!("expected a batch error for image 0, got {other:?}"),
        }
    }

    #[test]
    fn thread_counts_are_checked_and_pools_kept() {
        assert!(thread_pool(Some(0)).is_err());
        assert!(thread_pool(Some(MAX_THREADS + 1)).is_err());
        let a = thread_pool(Some(2)).unwrap();
        let b = thread_pool(Some(2)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.current_num_threads(), 2);
    }
}
