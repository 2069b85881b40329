//! A thread pool that shares its threads out fairly between callers: each
//! caller's batch is handed out one item at a time, round-robin across the
//! batches waiting (a new batch first), so one caller's long batch cannot
//! hold every thread while another's waits behind it (a work-stealing pool such as rayon's
//! finishes the batch it is on first). Used for publishing, where each
//! batch is one request's images.

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use crate::errors::{Error, Result};

/// One caller's batch: `job(i)` for every `i < len`.
struct Batch {
    /// Borrowed from the caller's stack frame, which does not return before
    /// `remaining` reaches 0 (see [`FairPool::run`]).
    job: &'static (dyn Fn(usize) + Sync),
    len: usize,
    remaining: Mutex<usize>,
    finished: Condvar,
}

impl Batch {
    fn finish_one(&self) {
        let mut remaining = lock(&self.remaining);
        *remaining -= 1;
        if *remaining == 0 {
            self.finished.notify_all();
        }
    }

    fn wait(&self) {
        let mut remaining = lock(&self.remaining);
        while *remaining > 0 {
            remaining = self
                .finished
                .wait(remaining)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

#[derive(Default)]
struct Queue {
    /// Batches with items not yet handed out, each with its next item.
    waiting: Mutex<VecDeque<(Arc<Batch>, usize)>>,
    ready: Condvar,
}

pub struct FairPool {
    queue: Arc<Queue>,
    threads: usize,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FairPool {
    fn new(threads: usize) -> Result<FairPool> {
        let queue = Arc::new(Queue::default());
        for i in 0..threads {
            let queue = Arc::clone(&queue);
            std::thread::Builder::new()
                .name(format!("pixelwire-publish-{i}"))
                .spawn(move || serve(&queue))
                .map_err(|e| {
                    Error::InvalidArgument(format!("could not start {threads} threads: {e}"))
                })?;
        }
        Ok(FairPool { queue, threads })
    }

    /// The process's pool of `threads` threads (every core when `None`),
    /// made on first use. Its threads live as long as the process.
    pub fn shared(threads: Option<usize>) -> Result<Arc<FairPool>> {
        static POOLS: OnceLock<Mutex<HashMap<usize, Arc<FairPool>>>> = OnceLock::new();
        let threads = crate::decode::thread_count(threads)?;
        let mut pools = lock(POOLS.get_or_init(Default::default));
        // Few sizes are ever asked for (the default, and tests'); the
        // bound keeps a caller naming many from starting threads unbounded.
        if let Some(pool) = pools.get(&threads) {
            return Ok(Arc::clone(pool));
        }
        if pools.len() >= 8 {
            return Err(Error::InvalidArgument(
                "too many publish pool sizes in one process (8 at most)".to_string(),
            ));
        }
        let pool = Arc::new(FairPool::new(threads)?);
        pools.insert(threads, Arc::clone(&pool));
        Ok(pool)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// `work(i)` for every `i < len` on the pool's threads, sharing them
    /// with the other callers' batches item by item; the results in order.
    /// Blocks until every item is done. `work` must not panic (a panic is
    /// caught, but its item then has no result, and this call panics).
    pub fn run<T: Send>(&self, len: usize, work: impl Fn(usize) -> T + Sync) -> Vec<T> {
        if len == 0 {
            return Vec::new();
        }
        let results: Vec<Mutex<Option<T>>> = (0..len).map(|_| Mutex::new(None)).collect();
        let job = |index: usize| {
            let outcome = work(index);
            *lock(&results[index]) = Some(outcome);
        };
        let job: &(dyn Fn(usize) + Sync) = &job;
        // SAFETY: the batch's threads call `job` only for items handed out,
        // and this function does not return (nor unwind: `wait` cannot
        // panic) before every one of the `len` items has finished, so the
        // erased borrow never outlives `job`, `work` or `results`.
        let job: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(job) };
        let batch = Arc::new(Batch {
            job,
            len,
            remaining: Mutex::new(len),
            finished: Condvar::new(),
        });
        // A new batch goes first: a request's first image waits only for
        // the images already being decoded, then takes its turn.
        lock(&self.queue.waiting).push_front((Arc::clone(&batch), 0));
        self.queue.ready.notify_all();
        batch.wait();
        results
            .into_iter()
            .map(|cell| {
                cell.into_inner()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .expect("an item of a fair-pool batch panicked")
            })
            .collect()
    }
}

/// How much a pool thread's priority is lowered (a Linux nice value, per
/// thread): bulk decoding yields the CPU to the process's other threads,
/// the event loop and the small images decoded where they are asked for,
/// so that requests of many large images cannot crowd out small ones. It
/// costs nothing when nothing else wants the CPU.
const NICE: libc::c_int = 10;

fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain system calls on this thread's own id.
    unsafe {
        let tid = libc::gettid();
        // A failure leaves the thread at the process's priority: only
        // latency, never correctness, depends on it.
        libc::setpriority(libc::PRIO_PROCESS as _, tid as libc::id_t, NICE);
    }
}

/// A pool thread: takes the next item of the batch at the front of the
/// queue, puts that batch at the back if it has more, and runs the item.
fn serve(queue: &Queue) {
    lower_priority();
    loop {
        let (batch, index) = {
            let mut waiting = lock(&queue.waiting);
            loop {
                if let Some((batch, next)) = waiting.pop_front() {
                    if next + 1 < batch.len {
                        waiting.push_back((Arc::clone(&batch), next + 1));
                    }
                    break (batch, next);
                }
                waiting = queue
                    .ready
                    .wait(waiting)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        // A panicking item leaves its result empty; the thread goes on.
        let _ = catch_unwind(AssertUnwindSafe(|| (batch.job)(index)));
        batch.finish_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    #[test]
    fn results_come_back_in_order() {
        let pool = FairPool::new(3).unwrap();
        for len in [0, 1, 2, 7, 64] {
            let results = pool.run(len, |i| i * 10);
            assert_eq!(results, (0..len).map(|i| i * 10).collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_short_batch_is_not_held_behind_a_long_one() {
        // One thread: a long batch of slow items is running when a batch of
        // one item arrives. It goes first, so it runs as soon as the item in
        // progress ends, not after the whole long batch.
        let pool = Arc::new(FairPool::new(1).unwrap());
        let started = Arc::new(AtomicUsize::new(0));
        let long = {
            let (pool, started) = (Arc::clone(&pool), Arc::clone(&started));
            std::thread::spawn(move || {
                pool.run(20, |_| {
                    started.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                })
            })
        };
        while started.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let asked = Instant::now();
        let long_items_before = pool.run(1, |_| started.load(Ordering::SeqCst))[0];
        let waited = asked.elapsed();
        long.join().unwrap();
        assert_eq!(
            long_items_before, 1,
            "the short batch waited for {long_items_before} items of the long one ({waited:?})"
        );
    }

    #[test]
    fn batches_take_turns_item_by_item() {
        // One thread, two batches queued while a third item holds it: the
        // items then alternate between them.
        let pool = Arc::new(FairPool::new(1).unwrap());
        let order = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new(AtomicUsize::new(0));
        let holder = {
            let (pool, gate) = (Arc::clone(&pool), Arc::clone(&gate));
            std::thread::spawn(move || {
                pool.run(1, |_| {
                    gate.store(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(500));
                })
            })
        };
        while gate.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let batches: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let (pool, order) = (Arc::clone(&pool), Arc::clone(&order));
                let batch = std::thread::spawn(move || {
                    pool.run(3, |i| lock(&order).push(format!("{name}{i}")))
                });
                std::thread::sleep(Duration::from_millis(50));
                batch
            })
            .collect();
        holder.join().unwrap();
        for batch in batches {
            batch.join().unwrap();
        }
        let order = lock(&order).clone();
        assert_eq!(order.len(), 6);
        for pair in order.windows(2) {
            assert_ne!(pair[0][..1], pair[1][..1], "items alternate: {order:?}");
        }
    }

    #[test]
    fn a_panicking_item_keeps_the_thread() {
        let pool = Arc::new(FairPool::new(1).unwrap());
        let panicking = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || pool.run(2, |i| assert_ne!(i, 1)))
        };
        assert!(panicking.join().is_err(), "the caller learns of the panic");
        assert_eq!(pool.run(3, |i| i), [0, 1, 2], "the thread still serves");
    }
}
