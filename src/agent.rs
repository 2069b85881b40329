//! One NIXL agent with the UCX backend, through nixl-sys's run-time loaded
//! C API, and the registered memory it moves bytes between.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nixl_sys::{
    AgentConfig, Backend, MemType, MemoryRegion, NixlDescriptor, NotificationMap, OptArgs,
    RegistrationHandle, ThreadSync, XferDescList, XferOp, XferRequest, XferStatus,
};

use std::sync::Arc;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::errors::{Error, Result};
use crate::pool::{Pool, Slot};
use crate::wire::{SlotHeader, SLOT_HEADER_BYTES};

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

/// Page-aligned, zeroed host memory that NIXL can register. Access to the
/// bytes is coordinated by the pools that hand out disjoint ranges.
#[derive(Debug)]
pub struct HostRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain heap memory; concurrent access to disjoint
// ranges is arranged by its owner (the slot pools).
unsafe impl Send for HostRegion {}
unsafe impl Sync for HostRegion {}

const PAGE: usize = 4096;

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

/// Asks for transparent huge pages and touches every page of a fresh
/// region once, so that no READ into it (nor a decode) pays page faults,
/// and copies into it walk fewer page-table entries.
fn prefault(ptr: *mut u8, len: usize) {
    // SAFETY: `ptr..ptr+len` is one allocation of ours (page-aligned); the
    // advice is only a hint and failure changes nothing.
    unsafe {
        libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE);
    }
    let mut at = 0;
    while at < len {
        // SAFETY: in bounds; the byte is zero (alloc_zeroed) and stays zero.
        unsafe { std::ptr::write_volatile(ptr.add(at), 0) };
        at += PAGE;
    }
}

impl HostRegion {
    pub fn new(len: usize) -> Result<HostRegion> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|_| Error::PoolExhausted(format!("cannot lay out a {len}-byte region")))?;
        // SAFETY: non-zero size layout.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
            .ok_or_else(|| Error::PoolExhausted(format!("cannot allocate a {len}-byte region")))?;
        prefault(ptr.as_ptr(), len);
        Ok(HostRegion { ptr, len })
    }

    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// # Safety
    /// The caller must own `offset..offset+len` exclusively (a pool slot).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        assert!(offset + len <= self.len, "slot outside its region");
        std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len)
    }

    /// # Safety
    /// No one may write `offset..offset+len` while the slice lives.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset + len <= self.len, "slot outside its region");
        std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len)
    }

    /// The generation word of the slot header at `offset` (64-aligned).
    fn generation_word(&self, offset: usize) -> &AtomicU64 {
        assert!(
            offset.is_multiple_of(8) && offset + SLOT_HEADER_BYTES <= self.len,
            "slot header outside its region"
        );
        // SAFETY: in bounds and 8-aligned (regions are page-aligned, slots
        // 64-aligned); an AtomicU64 has u64's layout.
        unsafe { &*(self.ptr.as_ptr().add(offset + SlotHeader::GENERATION_AT) as *const AtomicU64) }
    }

    /// Publishes the slot header at `offset`: the fields first, the
    /// generation last, after every pixel write.
    ///
    /// # Safety
    /// The caller owns the slot at `offset` (the pool lock or the slot).
    pub unsafe fn write_slot_header(&self, offset: usize, header: &SlotHeader) {
        let word = self.generation_word(offset);
        let prefix = header.prefix();
        std::ptr::copy_nonoverlapping(prefix.as_ptr(), self.ptr.as_ptr().add(offset), prefix.len());
        fence(Ordering::Release);
        word.store(header.generation, Ordering::Release);
    }

    /// Marks the slot at `offset` free (generation 0) before anyone else may
    /// write its range, so a READ still in flight on it fails its check.
    ///
    /// # Safety
    /// The caller holds the lock of the pool the slot is being freed from.
    pub unsafe fn clear_slot_header(&self, offset: usize) {
        self.generation_word(offset).store(0, Ordering::Release);
        fence(Ordering::SeqCst);
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len.max(1), PAGE),
            )
        }
    }
}

impl MemoryRegion for HostRegion {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for HostRegion {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }
    fn device_id(&self) -> u64 {
        0
    }
}

/// Memory owned by someone else (a CUDA tensor): address, size, kind.
#[derive(Debug)]
pub struct ForeignRegion {
    pub addr: usize,
    pub len: usize,
    pub mem_type: MemType,
    pub device: u64,
}

impl MemoryRegion for ForeignRegion {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.addr as *const u8
    }
    fn size(&self) -> usize {
        self.len
    }
}

impl NixlDescriptor for ForeignRegion {
    fn mem_type(&self) -> MemType {
        self.mem_type
    }
    fn device_id(&self) -> u64 {
        self.device
    }
}

/// How an agent's UCX backend runs.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// NIXL's progress thread, polling the backend's workers every 1 ms. The
    /// memory owner (the publisher) needs it; a reader that polls its own
    /// transfers does not, and without it no second thread contends for the
    /// worker's lock while a READ copies.
    pub progress_thread: bool,
    /// UCX backend threads that each post part of a multi-descriptor READ on
    /// their own worker (NIXL's `num_threads`); 0: one worker, the caller's.
    pub threads: usize,
}

impl Default for AgentOptions {
    fn default() -> AgentOptions {
        AgentOptions {
            progress_thread: true,
            threads: 0,
        }
    }
}

/// A NIXL agent with its UCX backend.
pub struct Agent {
    inner: nixl_sys::Agent,
    backend: Backend,
    name: String,
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
            // The progress thread polls with this timeout; 0 would spin a core.
            pthr_delay_us: 1000,
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
        // Failure only means it was not loaded.
        let _ = self.inner.invalidate_remote_md(name);
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
        let pending = self
            .inner
            .post_xfer_req(&request, None)
            .map_err(|e| ReadError {
                error: nixl_err("READ", e),
                may_land: true,
            })?;
        Ok(PostedRead {
            request,
            remote: remote.to_string(),
            len,
            started,
            done: !pending,
        })
    }

    /// Whether a posted READ has completed (one status check, no wait).
    fn poll_read(&self, posted: &mut PostedRead) -> std::result::Result<bool, ReadError> {
        if !posted.done {
            match self
                .inner
                .get_xfer_status(&posted.request)
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

/// A READ posted with [`Agent::post_read`].
pub struct PostedRead {
    request: XferRequest,
    remote: String,
    len: usize,
    started: Instant,
    done: bool,
}

impl PostedRead {
    fn failed(&self, error: Error) -> ReadError {
        ReadError {
            error,
            may_land: true,
        }
    }

    /// The error for a READ still running at its deadline.
    fn timed_out(&self) -> ReadError {
        self.failed(Error::Transfer(format!(
            "READ of {} bytes from {} timed out after {:?}",
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

/// A registered region; the handle is declared first so it deregisters
/// before the memory is freed.
pub struct Registered {
    _handle: Option<RegistrationHandle>,
    region: Arc<HostRegion>,
}

impl Registered {
    /// Allocates and registers a region; slow (page faults, NIXL), so pools
    /// call it without holding their lock.
    pub fn new(agent: &Agent, size: usize) -> Result<Registered> {
        let region = Arc::new(HostRegion::new(size)?);
        let handle = agent.register(region.as_ref())?;
        Ok(Registered {
            _handle: Some(handle),
            region,
        })
    }

    /// A region no agent knows: the pool's bookkeeping without NIXL (tests).
    #[cfg(test)]
    fn unregistered(size: usize) -> Result<Registered> {
        Ok(Registered {
            _handle: None,
            region: Arc::new(HostRegion::new(size)?),
        })
    }
}

/// Slots in host regions registered with one agent, a region added at a time
/// (never past the cap), so memory is registered once, not per image. When
/// nothing fits and the cap is reached, regions that hold no slot are given
/// up to make room, so a pool that grew for mid-size images still serves an
/// image as large as the cap once enough of it drains.
pub struct RegisteredPool {
    pub pool: Pool,
    /// Indexed like the pool's regions.
    regions: Vec<Option<Registered>>,
    cap: usize,
    region_bytes: usize,
    /// Bytes being registered right now, outside the lock.
    growing: usize,
    /// Bumped whenever the registered set changes (the agent's metadata).
    version: u64,
}

/// A slot and the region it lives in.
pub struct Allocation {
    pub slot: Slot,
    pub region: Arc<HostRegion>,
    /// The registered set's version when the slot was taken: metadata of
    /// this version or later describes the slot's region.
    pub version: u64,
}

/// What the pool needs before it can hand out a slot.
enum Step {
    Got(Allocation),
    /// Register this many bytes (outside the lock), then `add` them.
    Grow(usize),
    /// Nothing fits until slots are freed.
    Wait,
}

impl RegisteredPool {
    pub fn new(cap: usize, region_bytes: usize) -> RegisteredPool {
        RegisteredPool {
            pool: Pool::new(),
            regions: Vec::new(),
            cap,
            region_bytes: region_bytes.max(1),
            growing: 0,
            version: 0,
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn region(&self, index: usize) -> &HostRegion {
        &self.regions[index]
            .as_ref()
            .expect("a region holding a live slot is registered")
            .region
    }

    fn step(&mut self, len: usize, retired: &mut Vec<Registered>) -> Step {
        if let Some(slot) = self.pool.allocate(len) {
            let region = Arc::clone(&self.regions[slot.region].as_ref().expect("live").region);
            return Step::Got(Allocation {
                slot,
                region,
                version: self.version,
            });
        }
        let size = self
            .region_bytes
            .max(len)
            .div_ceil(PAGE)
            .saturating_mul(PAGE)
            .min(self.cap)
            .max(len);
        let used = self.pool.region_bytes() + self.growing;
        if used + size > self.cap {
            let mut empty = self.pool.empty_regions();
            empty.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
            let mut freed = 0;
            for (index, bytes) in empty {
                if used - freed + size <= self.cap {
                    break;
                }
                if self.pool.remove_region(index) {
                    retired.extend(self.regions[index].take());
                    freed += bytes;
                }
            }
            if freed > 0 {
                self.version += 1;
            }
            if used - freed + size > self.cap {
                return Step::Wait;
            }
        }
        self.growing += size;
        Step::Grow(size)
    }

    fn add(&mut self, registered: Registered) {
        let size = registered.region.len();
        self.growing -= size;
        let index = self.pool.add_region(size);
        if index == self.regions.len() {
            self.regions.push(Some(registered));
        } else {
            self.regions[index] = Some(registered);
        }
        self.version += 1;
    }
}

/// A [`RegisteredPool`] behind its lock, with the condition freed slots are
/// signalled on.
pub struct SlotPool {
    state: Mutex<RegisteredPool>,
    freed: Condvar,
}

impl SlotPool {
    pub fn new(cap: usize, region_bytes: usize) -> SlotPool {
        SlotPool {
            state: Mutex::new(RegisteredPool::new(cap, region_bytes)),
            freed: Condvar::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, RegisteredPool> {
        self.state.lock()
    }

    /// Wakes callers waiting in [`SlotPool::acquire`].
    pub fn notify_freed(&self) {
        self.freed.notify_all();
    }

    /// A slot of `len` bytes. When the pool must grow, memory is allocated
    /// and registered without the lock held (releases and stats go on);
    /// empty regions given up to make room are deregistered likewise. Waits
    /// for slots to be freed until `deadline`: `Ok(None)` then. `tidy` runs
    /// under the lock before each attempt (the reader ends quarantines there).
    pub fn acquire(
        &self,
        agent: &Agent,
        len: usize,
        deadline: Instant,
        tidy: impl FnMut(&mut RegisteredPool),
    ) -> Result<Option<Allocation>> {
        self.acquire_with(len, deadline, tidy, |size| Registered::new(agent, size))
    }

    fn acquire_with(
        &self,
        len: usize,
        deadline: Instant,
        mut tidy: impl FnMut(&mut RegisteredPool),
        register: impl Fn(usize) -> Result<Registered>,
    ) -> Result<Option<Allocation>> {
        let mut retired = Vec::new();
        let mut state = self.state.lock();
        loop {
            tidy(&mut state);
            match state.step(len, &mut retired) {
                Step::Got(allocation) => {
                    drop(state);
                    drop(retired);
                    return Ok(Some(allocation));
                }
                Step::Grow(size) => {
                    let registered = MutexGuard::unlocked(&mut state, || {
                        retired.clear();
                        register(size)
                    });
                    match registered {
                        Ok(registered) => state.add(registered),
                        Err(e) => {
                            state.growing -= size;
                            return Err(e);
                        }
                    }
                }
                Step::Wait => {
                    if !retired.is_empty() {
                        MutexGuard::unlocked(&mut state, || retired.clear());
                        continue;
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        return Ok(None);
                    }
                    // Bounded waits: quarantines end without a signal.
                    self.freed
                        .wait_until(&mut state, deadline.min(now + Duration::from_millis(100)));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn the_pool_lock_is_free_while_a_region_registers() {
        let pool = Arc::new(SlotPool::new(1 << 20, 64 << 10));
        let (entered, registering) = mpsc::channel();
        let (finish, go_on) = mpsc::channel::<()>();
        let grower = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(30);
                pool.acquire_with(
                    1000,
                    deadline,
                    |_| {},
                    |size| {
                        entered.send(()).unwrap();
                        go_on.recv().unwrap();
                        Registered::unregistered(size)
                    },
                )
            })
        };
        registering.recv().unwrap();
        // Releases and stats need the lock while a region registers.
        let usage = pool
            .state
            .try_lock_for(Duration::from_secs(10))
            .map(|state| state.pool.bytes_in_use());
        finish.send(()).unwrap();
        let allocation = grower.join().unwrap().unwrap().unwrap();
        assert_eq!(usage, Some(0), "the lock was held during registration");
        assert_eq!(allocation.slot.len, 1000);
        assert_eq!(allocation.version, 1);
    }

    #[test]
    fn empty_regions_give_way_to_a_larger_image() {
        let pool = SlotPool::new(256 << 10, 64 << 10);
        let soon = || Instant::now() + Duration::from_millis(200);
        let register = |size| Registered::unregistered(size);
        let held: Vec<_> = (0..4)
            .map(|_| {
                pool.acquire_with(40 << 10, soon(), |_| {}, register)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        assert_eq!(pool.lock().pool.region_count(), 4);
        assert!(
            pool.acquire_with(200 << 10, soon(), |_| {}, register)
                .unwrap()
                .is_none(),
            "no room while every region holds a slot"
        );
        for a in &held {
            assert!(pool.lock().pool.release(a.slot.id, a.slot.generation));
        }
        let large = pool
            .acquire_with(200 << 10, soon(), |_| {}, register)
            .unwrap()
            .unwrap();
        let state = pool.lock();
        assert_eq!(large.slot.len, 200 << 10);
        assert!(state.pool.region_bytes() <= 256 << 10);
        assert!(
            large.version > held.last().unwrap().version,
            "the metadata changed"
        );
    }
}
