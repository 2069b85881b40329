//! One NIXL agent with the UCX backend, through nixl-sys's run-time loaded
//! C API: library loading, memory registration, metadata, READs and
//! notifications. The memory it moves bytes between is `region.rs`.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_sys::{
    AgentConfig, Backend, MemType, NixlDescriptor, NotificationMap, OptArgs, RegistrationHandle,
    ThreadSync, XferDescList, XferOp, XferRequest, XferStatus,
};

use parking_lot::Mutex;

use crate::errors::{Error, Result};

/// The page: READs are split on page boundaries, and the regions they land
/// in (`region.rs`) are whole pages.
pub const PAGE: usize = 4096;

static LIBRARY_LOADED: AtomicBool = AtomicBool::new(false);

/// Loads `libnixl_capi.so` from `path` (the `nixl` wheel's copy). nixl-sys
/// later `dlopen`s the bare name, which glibc satisfies from this already
/// loaded library; without it nixl-sys aborts the process.
pub fn load_library(path: &str) -> Result<()> {
    let c_path =
        CString::new(path).map_err(|_| Error::Transfer("NIXL library path contains NUL".into()))?;
    // SAFETY: plain dlopen of a path; the handle is deliberately kept for the
    // life of the process.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a NUL-terminated string after a failed dlopen.
        let why = unsafe { std::ffi::CStr::from_ptr(libc::dlerror()) }
            .to_string_lossy()
            .into_owned();
        return Err(Error::Transfer(format!(
            "cannot load NIXL from {path}: {why}"
        )));
    }
    LIBRARY_LOADED.store(true, Ordering::SeqCst);
    Ok(())
}

fn nixl_err(what: &str, e: nixl_sys::NixlError) -> Error {
    Error::Transfer(format!("NIXL {what} failed: {e}"))
}

/// How READs are waited for ([`Waiting`]): polled between yields for
/// [`spin_for`], then between sleeps that grow from `SLEEP_FIRST` to
/// `SLEEP_MAX` (a stuck READ costs little CPU, and a slow one is found done
/// at most `SLEEP_MAX` late).
const SLEEP_FIRST: Duration = Duration::from_micros(50);
const SLEEP_MAX: Duration = Duration::from_micros(500);
/// How long a READ is polled between yields before the waiting thread
/// sleeps. With cores to spare, 5 ms: at 5-10 GB/s a 24 MB image takes
/// 2.5-5 ms, and its end is then found at once. Without, 300 µs: the
/// yielding thread would take time from the UCX threads doing the copy.
fn spin_for() -> Duration {
    if crate::background::has_spare_cores() {
        Duration::from_millis(5)
    } else {
        Duration::from_micros(300)
    }
}

/// The progress thread's poll() timeout, in microseconds (rounded up to
/// whole milliseconds by NIXL): a publisher's. Each timeout wakes the
/// thread to progress every worker of the agent.
const PROGRESS_THREAD_TIMEOUT_US: u64 = 10_000;

/// The same for a reader's agent, which progresses its own READs as it
/// waits for them: its progress thread only carries what goes on between
/// reads (connections, notifications UCX did not wake it for). A reader
/// stays open for the life of vLLM's API server, and at 10 ms its four
/// workers cost 4 to 5 ms of CPU a second idle (benches/reader_idle_cpu.py).
pub const READER_PROGRESS_THREAD_TIMEOUT_US: u64 = 100_000;

/// How an agent's UCX backend runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// NIXL's progress thread, polling the backend's workers. The
    /// memory owner (the publisher) needs it; a reader that polls its own
    /// transfers does not, and without it no second thread contends for the
    /// worker's lock while a READ copies.
    pub progress_thread: bool,
    /// That thread's poll() timeout, in microseconds.
    pub progress_timeout_us: u64,
    /// UCX backend threads that each post part of a multi-descriptor READ on
    /// their own worker (NIXL's `num_threads`); 0: one worker, the caller's.
    pub threads: usize,
}

impl Default for AgentOptions {
    fn default() -> AgentOptions {
        AgentOptions {
            progress_thread: true,
            progress_timeout_us: PROGRESS_THREAD_TIMEOUT_US,
            threads: 0,
        }
    }
}

/// The longest a reader being dropped waits for READs it gave up on to
/// end, before it leaks them (with the agent, and the memory they may
/// write) rather than destroy UCX state they are queued in.
pub const SETTLE_ON_DROP: Duration = Duration::from_secs(2);

/// How long forgetting a frontend waits for READs from it that were given
/// up on.
const SETTLE_ON_FORGET: Duration = Duration::from_millis(500);

/// READs given up on while UCX may still be serving them: timed out, or
/// left when another chunk of the same read failed. Releasing such a
/// request asks UCX to cancel it, which a READ cannot be: the operation
/// stays queued on its endpoint, and a UCX worker destroyed with it queued
/// aborts the process (an assertion that its pending queues are empty). So
/// they are kept, and polled (which also progresses the worker) until they
/// end, by later READs, before a frontend is forgotten, and when the agent
/// goes.
#[derive(Default)]
struct Abandoned {
    requests: Mutex<Vec<(String, XferRequest)>>,
}

/// A NIXL agent with its UCX backend.
pub struct Agent {
    inner: nixl_sys::Agent,
    backend: Backend,
    name: String,
    abandoned: Arc<Abandoned>,
}

static AGENT_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Agent {
    /// Creates an agent named `pixelwire-{role}-{pid}-{n}-{nanos}`: unique per
    /// process start, so a restarted frontend is never mistaken for the old one.
    pub fn new(role: &str, options: &AgentOptions) -> Result<Agent> {
        if !LIBRARY_LOADED.load(Ordering::SeqCst) {
            return Err(Error::Transfer(
                "NIXL library not loaded (pixelwire loads it from the nixl wheel)".into(),
            ));
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "pixelwire-{role}-{}-{}-{nanos:x}",
            std::process::id(),
            AGENT_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let config = AgentConfig {
            enable_prog_thread: options.progress_thread,
            enable_listen_thread: false,
            thread_sync: ThreadSync::Strict,
            // The progress thread sleeps in poll() on its workers' event fds,
            // woken by UCX activity; the timeout only guards against a wake
            // UCX misses (NIXL's note), and 0 would spin a core. At 1 ms an
            // idle frontend woke 1,000 times a second, 2.5 % of a core.
            pthr_delay_us: options.progress_timeout_us,
            ..Default::default()
        };
        let inner = nixl_sys::Agent::new_configured(&name, &config)
            .map_err(|e| nixl_err("agent creation", e))?;
        let (_mems, mut params) = inner
            .get_plugin_params("UCX")
            .map_err(|e| nixl_err("UCX plugin lookup", e))?;
        // "peer" makes a dead peer fail transfers instead of hanging them.
        params
            .set("ucx_error_handling_mode", "peer")
            .map_err(|e| nixl_err("UCX parameters", e))?;
        if options.threads > 0 {
            // Requests of two or more descriptors are split across the
            // threads; single-descriptor ones stay on the caller's worker.
            params
                .set("num_threads", &options.threads.to_string())
                .map_err(|e| nixl_err("UCX parameters", e))?;
            params
                .set("split_batch_size", "2")
                .map_err(|e| nixl_err("UCX parameters", e))?;
        }
        let backend = inner
            .create_backend("UCX", &params)
            .map_err(|e| nixl_err("UCX backend creation", e))?;
        Ok(Agent {
            inner,
            backend,
            name,
            abandoned: Arc::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn register(&self, region: &impl NixlDescriptor) -> Result<RegistrationHandle> {
        self.inner
            .register_memory(region, None)
            .map_err(|e| nixl_err("memory registration", e))
    }

    pub fn local_metadata(&self) -> Result<Vec<u8>> {
        self.inner
            .get_local_md()
            .map_err(|e| nixl_err("metadata export", e))
    }

    /// Loads a remote agent's metadata (which connects to it); returns the
    /// agent name it carries. Failure is a transfer error: it usually means
    /// the frontend is gone.
    pub fn load_remote(&self, metadata: &[u8]) -> Result<String> {
        self.inner.load_remote_md(metadata).map_err(|e| {
            Error::Transfer(format!(
                "NIXL could not connect to the frontend from its metadata: {e}"
            ))
        })
    }

    pub fn forget_remote(&self, name: &str) {
        self.settle(Some(name), Instant::now() + SETTLE_ON_FORGET);
        // Failure only means it was not loaded.
        let _ = self.inner.invalidate_remote_md(name);
    }

    /// Polls the READs given up on, letting go of those that ended; how many
    /// are still running (from `remote` only, if given).
    fn reap(&self, remote: Option<&str>) -> usize {
        let mut requests = self.abandoned.requests.lock();
        requests.retain(|(_, request)| {
            matches!(
                self.inner.get_xfer_status(request),
                Ok(XferStatus::InProgress)
            )
        });
        requests
            .iter()
            .filter(|(from, _)| remote.is_none_or(|name| name == from))
            .count()
    }

    /// Waits until no READ given up on (from `remote`, if given) is still
    /// running, or until `deadline`; whether none is.
    pub fn settle(&self, remote: Option<&str>, deadline: Instant) -> bool {
        let mut waiting = Waiting::new();
        loop {
            if self.reap(remote) == 0 {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            waiting.pause();
        }
    }

    /// READs given up on that UCX may still be serving.
    pub fn abandoned_count(&self) -> usize {
        self.abandoned.requests.lock().len()
    }

    /// READs `span` = (remote address, length) of `remote`'s registered
    /// memory into `local` = (address, memory type, device), split into
    /// `pieces` descriptors (which a threaded backend moves in parallel),
    /// attaching `notification` if any, and waits for completion (until
    /// `deadline`) without holding any Python lock. An error or timeout
    /// leaves the destination indeterminate: the caller must not hand it out,
    /// and if [`ReadError::may_land`] it must not reuse it for a while.
    pub fn read(
        &self,
        remote: &str,
        local: (usize, MemType, u64),
        span: (usize, usize),
        pieces: usize,
        notification: Option<&[u8]>,
        deadline: Instant,
    ) -> std::result::Result<(), ReadError> {
        let mut posted = self.post_read(remote, local, span, pieces, notification)?;
        self.wait_read(&mut posted, deadline)
    }

    /// [`Agent::read`] without the wait: the READ is posted (bytes may land
    /// from here on) and [`Agent::wait_read`] says when it is done. Several
    /// may be in flight at once.
    pub fn post_read(
        &self,
        remote: &str,
        local: (usize, MemType, u64),
        span: (usize, usize),
        pieces: usize,
        notification: Option<&[u8]>,
    ) -> std::result::Result<PostedRead, ReadError> {
        if !self.abandoned.requests.lock().is_empty() {
            self.reap(None);
        }
        let (remote_addr, len) = span;
        let refused = |error: Error| ReadError {
            error,
            may_land: false,
        };
        let (local_addr, local_type, local_dev) = local;
        let mut local_list =
            XferDescList::new(local_type).map_err(|e| refused(nixl_err("descriptor list", e)))?;
        let mut remote_list = XferDescList::new(MemType::Dram)
            .map_err(|e| refused(nixl_err("descriptor list", e)))?;
        // Pieces of whole pages (the last takes the rest).
        let piece = len.div_ceil(pieces.max(1)).div_ceil(PAGE).max(1) * PAGE;
        let mut at = 0;
        loop {
            let n = piece.min(len - at);
            local_list.add_desc(local_addr + at, n, local_dev);
            remote_list.add_desc(remote_addr + at, n, 0);
            at += n;
            if at >= len {
                break;
            }
        }
        let mut opts = OptArgs::new().map_err(|e| refused(nixl_err("options", e)))?;
        opts.add_backend(&self.backend)
            .map_err(|e| refused(nixl_err("options", e)))?;
        if let Some(message) = notification {
            opts.set_notification_message(message)
                .map_err(|e| refused(nixl_err("options", e)))?;
            opts.set_has_notification(true)
                .map_err(|e| refused(nixl_err("options", e)))?;
        }
        let request = self
            .inner
            .create_xfer_req(XferOp::Read, &local_list, &remote_list, remote, Some(&opts))
            .map_err(|e| {
                refused(Error::Transfer(format!(
                    "NIXL refused the READ of {len} bytes at {remote_addr:#x} from {remote}: {e} (address outside the frontend's registered memory, or the frontend is gone)"
                )))
            })?;
        let started = Instant::now();
        let outcome = self.inner.post_xfer_req(&request, None);
        let mut posted = PostedRead {
            request: Some(request),
            abandoned: Arc::clone(&self.abandoned),
            remote: remote.to_string(),
            len,
            started,
            done: false,
        };
        match outcome {
            Ok(pending) => {
                posted.done = !pending;
                Ok(posted)
            }
            // Dropping `posted` keeps the request until UCX is done with it.
            Err(e) => Err(posted.failed(nixl_err("READ", e))),
        }
    }

    /// Whether a posted READ has completed (one status check, no wait).
    pub fn poll_read(&self, posted: &mut PostedRead) -> std::result::Result<bool, ReadError> {
        if let (false, Some(request)) = (posted.done, &posted.request) {
            match self
                .inner
                .get_xfer_status(request)
                .map_err(|e| posted.failed(nixl_err("READ", e)))?
            {
                XferStatus::Success => posted.done = true,
                XferStatus::InProgress => {}
            }
        }
        Ok(posted.done)
    }

    /// Waits for a posted READ until `deadline`.
    pub fn wait_read(
        &self,
        posted: &mut PostedRead,
        deadline: Instant,
    ) -> std::result::Result<(), ReadError> {
        let mut waiting = Waiting::new();
        while !self.poll_read(posted)? {
            if Instant::now() > deadline {
                return Err(posted.timed_out());
            }
            waiting.pause();
        }
        Ok(())
    }

    /// Notification messages received since the last call, as raw bytes,
    /// one by one: a message that is not what pixelwire sends is the
    /// caller's to skip, and never costs the others.
    pub fn take_notifications(&self) -> Result<Vec<Vec<u8>>> {
        let mut map = NotificationMap::new().map_err(|e| nixl_err("notifications", e))?;
        self.inner
            .get_notifications(&mut map, None)
            .map_err(|e| nixl_err("notifications", e))?;
        let mut out = Vec::new();
        for agent in map.agents().flatten() {
            let count = map.get_notifications_size(agent).unwrap_or(0);
            for index in 0..count {
                if let Ok(message) = map.get_notification_bytes(agent, index) {
                    out.push(message);
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Its owner waited for them already (`settle`).
        if self.reap(None) > 0 {
            // Each request holds the NIXL agent: leaked, they keep it (and
            // its UCX worker) from being destroyed under them.
            std::mem::forget(std::mem::take(&mut *self.abandoned.requests.lock()));
        }
    }
}

/// A READ posted with [`Agent::post_read`]. Dropped before it is known to
/// have ended, its request goes to the agent's abandoned READs.
pub struct PostedRead {
    request: Option<XferRequest>,
    abandoned: Arc<Abandoned>,
    remote: String,
    len: usize,
    started: Instant,
    done: bool,
}

impl Drop for PostedRead {
    fn drop(&mut self) {
        if let (false, Some(request)) = (self.done, self.request.take()) {
            self.abandoned
                .requests
                .lock()
                .push((std::mem::take(&mut self.remote), request));
        }
    }
}

impl PostedRead {
    fn failed(&self, error: Error) -> ReadError {
        ReadError {
            error,
            may_land: true,
        }
    }

    /// The error for a READ still running at its read's deadline. The time
    /// is this READ's own: the read's limit also covers connecting and the
    /// chunks before it, so it can be short.
    fn timed_out(&self) -> ReadError {
        self.failed(Error::Transfer(format!(
            "READ of {} bytes from {} timed out: the read's time limit ran out {:?} after this READ was posted (connecting and earlier chunks took the rest)",
            self.len,
            self.remote,
            self.started.elapsed()
        )))
    }
}

/// How a thread waits for READs between status checks: a sleep costs ~50 us
/// of timer slack and a wake-up, and a READ's end found late is time lost,
/// so it yields while a READ of tens of MB may still be running at full
/// speed, and only then sleeps, longer each time.
pub struct Waiting {
    since: Instant,
    sleep: Duration,
}

impl Waiting {
    pub fn new() -> Waiting {
        Waiting {
            since: Instant::now(),
            sleep: SLEEP_FIRST,
        }
    }

    pub fn pause(&mut self) {
        if self.since.elapsed() < spin_for() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.sleep);
            self.sleep = (self.sleep * 2).min(SLEEP_MAX);
        }
    }
}

impl Default for Waiting {
    fn default() -> Waiting {
        Waiting::new()
    }
}

/// A failed READ: whether the transfer was posted, so that bytes may still
/// land in the destination after the error.
#[derive(Debug)]
pub struct ReadError {
    pub error: Error,
    pub may_land: bool,
}
