//! Native threads that run blocking jobs, and tickets to wait for a job's
//! result for a bounded time.
//!
//! A small READ takes tens of microseconds, less than handing it to a Python
//! thread and back costs (a thread wake-up and several GIL hand-offs each
//! way). A job given to these threads needs no GIL; its caller can wait for
//! it a short, bounded while (GIL released) and take the result in place,
//! and only if it is not ready by then wait for it elsewhere. A worker that
//! finishes a job spins a little before it sleeps, so a caller that submits
//! jobs one after another does not pay a wake-up for each.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Cores below which no thread of ours waits by yielding for long.
const SPARE_CORES: usize = 8;

/// Whether this process has cores to spare for threads that wait by
/// yielding instead of sleeping (they save a wake-up, and cost a core
/// while they wait). On 2 cores such threads took time from the threads
/// doing the work: a 24 MiB READ took twice as long.
pub fn has_spare_cores() -> bool {
    static SPARE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SPARE
        .get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()) >= SPARE_CORES)
}

/// How long a worker looks for new work before it sleeps: 100 µs with
/// cores to spare, else not at all.
fn spin() -> Duration {
    if has_spare_cores() {
        Duration::from_micros(100)
    } else {
        Duration::ZERO
    }
}
/// How long a worker sleeps without work before it exits.
const IDLE_EXIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Workers looking for work without sleeping: they will see a new job.
    spinning: usize,
    /// Workers asleep on `ready`.
    sleeping: usize,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    /// Jobs queued, readable without the lock by spinning workers.
    queued: AtomicUsize,
    max_threads: usize,
    name: String,
}

/// Up to `max_threads` worker threads, started when work arrives and gone
/// after [`IDLE_EXIT`] without any. Past `max_threads` busy workers, jobs
/// wait in order (a job that blocks for long holds only its own thread).
pub struct Background {
    shared: Arc<Shared>,
}

impl Background {
    pub fn new(name: &str, max_threads: usize) -> Background {
        Background {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue::default()),
                ready: Condvar::new(),
                queued: AtomicUsize::new(0),
                max_threads: max_threads.max(1),
                name: name.to_string(),
            }),
        }
    }

    /// Runs `work` on a worker; the ticket gives its result. A `work` that
    /// panics still completes its ticket (as [`Taken::Panicked`]) and
    /// leaves its worker running.
    pub fn submit<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Ticket<T> {
        self.submit_then(work, || ())
    }

    /// [`Background::submit`], then `then()` once the ticket is complete
    /// (to tell a waiter that watches something else, e.g. a
    /// [`DoneSignal`]).
    pub fn submit_then<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
        then: impl FnOnce() + Send + 'static,
    ) -> Ticket<T> {
        let ticket = Ticket::new();
        let done = ticket.clone();
        self.push(Box::new(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            done.complete(outcome.ok());
            then();
        }));
        ticket
    }

    fn push(&self, job: Job) {
        let shared = &self.shared;
        let mut queue = shared.queue.lock();
        queue.jobs.push_back(job);
        shared.queued.fetch_add(1, Ordering::Release);
        if queue.spinning >= queue.jobs.len() {
            // Spinning workers take every queued job; waking a sleeper too
            // would only cost a wake-up.
            return;
        }
        if queue.sleeping > 0 && shared.ready.notify_one() {
            // Counted out here, once: the woken worker does not.
            queue.sleeping -= 1;
            return;
        }
        if queue.threads < shared.max_threads {
            let worker = Arc::clone(shared);
            let spawned = std::thread::Builder::new()
                .name(shared.name.clone())
                .spawn(move || worker.work());
            if spawned.is_ok() {
                queue.threads += 1;
                queue.spinning += 1;
            }
        }
        // Otherwise every worker is busy: the job waits for the first to
        // finish (and if a spawn failed with no worker at all, the next
        // submit tries again).
    }

    /// Worker threads now running.
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.shared.queue.lock().threads
    }
}

impl Shared {
    /// A worker's life: spinning (counted in `spinning`, sees every new
    /// job), busy with a job (not counted), or asleep (counted in
    /// `sleeping` until a push wakes it or it times out). It starts
    /// spinning.
    fn work(&self) {
        while let Some(job) = self.next_job() {
            job();
            self.queue.lock().spinning += 1;
        }
    }

    /// The next job, for a spinning worker: looked for without sleeping for
    /// [`spin`], then asleep; `None` after [`IDLE_EXIT`] without work (the
    /// worker has been counted out).
    fn next_job(&self) -> Option<Job> {
        let spin_until = Instant::now() + spin();
        loop {
            if self.queued.load(Ordering::Acquire) > 0 {
                let mut queue = self.queue.lock();
                if let Some(job) = self.pop(&mut queue) {
                    queue.spinning -= 1;
                    return Some(job);
                }
            }
            if Instant::now() >= spin_until {
                break;
            }
            std::thread::yield_now();
        }
        let mut queue = self.queue.lock();
        queue.spinning -= 1;
        loop {
            if let Some(job) = self.pop(&mut queue) {
                return Some(job);
            }
            queue.sleeping += 1;
            if self.ready.wait_for(&mut queue, IDLE_EXIT).timed_out() {
                // Not woken by a push, so still counted: count out here.
                queue.sleeping -= 1;
                if queue.jobs.is_empty() {
                    queue.threads -= 1;
                    return None;
                }
            }
        }
    }

    fn pop(&self, queue: &mut Queue) -> Option<Job> {
        let job = queue.jobs.pop_front()?;
        self.queued.fetch_sub(1, Ordering::Release);
        Some(job)
    }
}

/// An eventfd that finished jobs raise, so that an event loop watching
/// one file descriptor learns that tickets are done without a thread of
/// its own blocked on each (a hand-off to a Python thread and back costs
/// a wake-up and several GIL hand-offs).
pub struct DoneSignal {
    fd: OwnedFd,
}

impl DoneSignal {
    pub fn new() -> std::io::Result<DoneSignal> {
        // SAFETY: plain syscall; a valid fd is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        Ok(DoneSignal {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor to watch for reading.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Makes the descriptor readable (until [`DoneSignal::clear`]).
    pub fn raise(&self) {
        let one: u64 = 1;
        // SAFETY: an 8-byte write from a local to our eventfd. It can only
        // fail with EAGAIN at a counter of 2^64-2, when it is readable
        // anyway.
        let _ = unsafe { libc::write(self.fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the descriptor unreadable again (raises after this call wake
    /// the watcher again).
    pub fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: an 8-byte read into a local from our non-blocking
        // eventfd; EAGAIN (nothing raised) is fine.
        let _ = unsafe { libc::read(self.fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

struct Slot<T> {
    done: AtomicBool,
    /// `Some(None)` once a job that panicked has ended.
    value: Mutex<Option<Option<T>>>,
    finished: Condvar,
}

/// What a ticket gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken<T> {
    Value(T),
    /// The job panicked (a bug): there is no result.
    Panicked,
    /// Only from [`Ticket::take_within`]: not finished within the budget.
    NotFinished,
    AlreadyTaken,
}

impl<T> Taken<T> {
    fn of(held: Option<Option<T>>) -> Taken<T> {
        match held {
            Some(Some(value)) => Taken::Value(value),
            Some(None) => Taken::Panicked,
            None => Taken::AlreadyTaken,
        }
    }
}

/// The result of a submitted job, taken once.
pub struct Ticket<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Clone for Ticket<T> {
    fn clone(&self) -> Self {
        Ticket {
            slot: Arc::clone(&self.slot),
        }
    }
}

impl<T> Ticket<T> {
    fn new() -> Ticket<T> {
        Ticket {
            slot: Arc::new(Slot {
                done: AtomicBool::new(false),
                value: Mutex::new(None),
                finished: Condvar::new(),
            }),
        }
    }

    fn complete(&self, value: Option<T>) {
        let mut held = self.slot.value.lock();
        *held = Some(value);
        self.slot.done.store(true, Ordering::Release);
        self.slot.finished.notify_all();
    }

    /// Whether the job has finished (its result may have been taken).
    pub fn is_done(&self) -> bool {
        self.slot.done.load(Ordering::Acquire)
    }

    /// The result if the job finishes within `budget` (waited for without
    /// sleeping: budgets are microseconds).
    pub fn take_within(&self, budget: Duration) -> Taken<T> {
        let until = Instant::now() + budget;
        while !self.is_done() {
            if Instant::now() >= until {
                return Taken::NotFinished;
            }
            std::thread::yield_now();
        }
        Taken::of(self.slot.value.lock().take())
    }

    /// The result, waiting as long as the job takes (never
    /// [`Taken::NotFinished`]).
    pub fn take(&self) -> Taken<T> {
        let mut held = self.slot.value.lock();
        while !self.is_done() {
            self.slot.finished.wait(&mut held);
        }
        Taken::of(held.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_runs_once_and_its_ticket_gives_its_result() {
        let pool = Background::new("test", 3);
        let tickets: Vec<_> = (0..200u64)
            .map(|i| {
                pool.submit(move || {
                    if i % 17 == 0 {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    i * i
                })
            })
            .collect();
        for (i, ticket) in tickets.iter().enumerate() {
            assert_eq!(ticket.take(), Taken::Value(i as u64 * i as u64));
            assert_eq!(ticket.take(), Taken::AlreadyTaken, "a result is taken once");
        }
        assert!(pool.threads() <= 3);
    }

    #[test]
    fn a_short_wait_gives_up_and_the_result_is_still_there() {
        let pool = Background::new("test", 2);
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock();
        let blocked = Arc::clone(&gate);
        let ticket = pool.submit(move || {
            let _open = blocked.lock();
            7
        });
        assert_eq!(
            ticket.take_within(Duration::from_micros(200)),
            Taken::NotFinished
        );
        assert!(!ticket.is_done());
        drop(held);
        assert_eq!(ticket.take_within(Duration::from_secs(5)), Taken::Value(7));
        assert_eq!(ticket.take_within(Duration::ZERO), Taken::AlreadyTaken);
        assert_eq!(ticket.take(), Taken::AlreadyTaken);
    }

    #[test]
    fn a_blocked_job_holds_only_its_own_thread() {
        let pool = Background::new("test", 4);
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock();
        let blocked = Arc::clone(&gate);
        let stuck = pool.submit(move || drop(blocked.lock()));
        let quick = pool.submit(|| 1);
        assert_eq!(quick.take(), Taken::Value(1));
        assert!(!stuck.is_done());
        drop(held);
        assert_eq!(stuck.take(), Taken::Value(()));
    }

    #[test]
    fn a_dropped_ticket_still_lets_its_job_finish() {
        let pool = Background::new("test", 1);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        drop(pool.submit(move || flag.store(true, Ordering::SeqCst)));
        assert_eq!(pool.submit(|| 2).take(), Taken::Value(2));
        assert!(ran.load(Ordering::SeqCst));
    }

    fn readable(signal: &DoneSignal) -> bool {
        let mut watch = libc::pollfd {
            fd: signal.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, no wait.
        unsafe { libc::poll(&mut watch, 1, 0) == 1 }
    }

    #[test]
    fn a_signalled_job_raises_its_signal_after_its_ticket_is_complete() {
        let pool = Background::new("test", 2);
        let signal = Arc::new(DoneSignal::new().unwrap());
        assert!(!readable(&signal));
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock();
        let blocked = Arc::clone(&gate);
        let raised = Arc::clone(&signal);
        let ticket = pool.submit_then(move || drop(blocked.lock()), move || raised.raise());
        assert!(!readable(&signal), "not before the job ends");
        drop(held);
        let until = Instant::now() + Duration::from_secs(5);
        while !readable(&signal) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(readable(&signal));
        assert!(
            ticket.is_done(),
            "the ticket is complete once the signal is up"
        );
        signal.clear();
        assert!(!readable(&signal));
        // A job that panics raises it too.
        let raised = Arc::clone(&signal);
        let ticket = pool.submit_then(
            || -> u8 { panic!("a bug in a job") },
            move || raised.raise(),
        );
        assert_eq!(ticket.take(), Taken::Panicked);
        let until = Instant::now() + Duration::from_secs(5);
        while !readable(&signal) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(readable(&signal));
    }

    #[test]
    fn a_job_that_panics_completes_its_ticket_and_keeps_its_worker() {
        let pool = Background::new("test", 1);
        let ticket = pool.submit(|| -> u8 { panic!("a bug in a job") });
        assert_eq!(ticket.take(), Taken::Panicked);
        assert_eq!(ticket.take(), Taken::AlreadyTaken);
        // The one worker is still there to run the next job.
        assert_eq!(
            pool.submit(|| 3).take_within(Duration::from_secs(5)),
            Taken::Value(3)
        );
        assert_eq!(pool.threads(), 1);
    }
}
