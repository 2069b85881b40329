//! Many images at once on a native thread pool: `decode_many`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

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
pub fn decode_many(
    pool: &rayon::ThreadPool,
    inputs: &[&[u8]],
    opts: &DecodeOptions,
    resize: Option<&crate::resize::Target>,
) -> Result<Vec<Decoded>> {
    let first_failure = AtomicUsize::new(usize::MAX);
    let outcomes: Vec<Option<Result<Decoded>>> = pool.install(|| {
        inputs
            .par_iter()
            .enumerate()
            // One image per task: images take milliseconds each, and
            // splitting no coarser keeps a large one from holding others back.
            .with_max_len(1)
            .map(|(index, data)| {
                if index > first_failure.load(Ordering::Relaxed) {
                    return None;
                }
                let outcome = probe(data, &opts.limits).and_then(|info| {
                    let shape = resized_shape(info.output_shape(opts), resize);
                    decode_resized(data, &info, opts, resize).map(|pixels| (shape, pixels))
                });
                if outcome.is_err() {
                    first_failure.fetch_min(index, Ordering::Relaxed);
                }
                Some(outcome)
            })
            .collect()
    });
    let mut decoded = Vec::with_capacity(inputs.len());
    for (index, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Some(Ok(image)) => decoded.push(image),
            Some(Err(error)) => {
                return Err(Error::Batch {
                    index,
                    error: Box::new(error),
                })
            }
            // Skipped inputs come after a failed one, which returned above.
            None => unreachable!("an input is skipped only after an earlier one failed"),
        }
    }
    Ok(decoded)
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
    fn thread_counts_are_checked_and_pools_kept() {
        assert!(thread_pool(Some(0)).is_err());
        assert!(thread_pool(Some(MAX_THREADS + 1)).is_err());
        let a = thread_pool(Some(2)).unwrap();
        let b = thread_pool(Some(2)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.current_num_threads(), 2);
    }
}
