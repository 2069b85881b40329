//! One NIXL agent with the UCX backend, through nixl-sys's run-time loaded
//! C API, and the registered memory it moves bytes between.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nixl_sys::{
    AgentConfig, Backend, MemType, MemoryRegion, NixlDescriptor, NotificationMap, OptArgs,
    RegistrationHandle, ThreadSync, XferDescList, XferOp, XferStatus,
};

use std::sync::Arc;

use crate::errors::{Error, Result};
use crate::pool::{Pool, Slot};

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

impl HostRegion {
    pub fn new(len: usize) -> Result<HostRegion> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|_| Error::PoolExhausted(format!("cannot lay out a {len}-byte region")))?;
        // SAFETY: non-zero size layout.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })
            .ok_or_else(|| Error::PoolExhausted(format!("cannot allocate a {len}-byte region")))?;
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
    pub fn new(role: &str) -> Result<Agent> {
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
            enable_prog_thread: true,
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

    /// READs `len` bytes at `remote_addr` of `remote` into `local_addr`,
    /// attaching `notification`, and waits for completion without holding
    /// any Python lock. An error or timeout leaves the destination
    /// indeterminate: the caller must not hand it out.
    pub fn read(
        &self,
        remote: &str,
        local: (usize, MemType, u64),
        remote_addr: usize,
        len: usize,
        notification: &[u8],
        timeout: Duration,
    ) -> Result<()> {
        let (local_addr, local_type, local_dev) = local;
        let mut local_list =
            XferDescList::new(local_type).map_err(|e| nixl_err("descriptor list", e))?;
        local_list.add_desc(local_addr, len, local_dev);
        let mut remote_list =
            XferDescList::new(MemType::Dram).map_err(|e| nixl_err("descriptor list", e))?;
        remote_list.add_desc(remote_addr, len, 0);
        let mut opts = OptArgs::new().map_err(|e| nixl_err("options", e))?;
        opts.add_backend(&self.backend)
            .map_err(|e| nixl_err("options", e))?;
        opts.set_notification_message(notification)
            .map_err(|e| nixl_err("options", e))?;
        opts.set_has_notification(true)
            .map_err(|e| nixl_err("options", e))?;
        let request = self
            .inner
            .create_xfer_req(XferOp::Read, &local_list, &remote_list, remote, Some(&opts))
            .map_err(|e| {
                Error::Transfer(format!(
                    "NIXL refused the READ of {len} bytes at {remote_addr:#x} from {remote}: {e} (address outside the frontend's registered memory, or the frontend is gone)"
                ))
            })?;
        let start = Instant::now();
        let mut pending = self
            .inner
            .post_xfer_req(&request, None)
            .map_err(|e| nixl_err("READ", e))?;
        let mut pause = Duration::from_micros(20);
        while pending {
            match self
                .inner
                .get_xfer_status(&request)
                .map_err(|e| nixl_err("READ", e))?
            {
                XferStatus::Success => pending = false,
                XferStatus::InProgress => {
                    let waited = start.elapsed();
                    if waited > timeout {
                        return Err(Error::Transfer(format!(
                            "READ of {len} bytes from {remote} timed out after {timeout:?}"
                        )));
                    }
                    // Small reads finish in microseconds, and a sleep costs
                    // ~50 us of timer slack: yield first, sleep only later.
                    if waited < Duration::from_micros(300) {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(1));
                    }
                }
            }
        }
        Ok(())
    }

    /// Notifications received since the last call, as (sender, message).
    pub fn take_notifications(&self) -> Result<Vec<(String, String)>> {
        let mut map = NotificationMap::new().map_err(|e| nixl_err("notifications", e))?;
        self.inner
            .get_notifications(&mut map, None)
            .map_err(|e| nixl_err("notifications", e))?;
        let by_agent = map
            .take_notifs()
            .map_err(|e| nixl_err("notifications", e))?;
        Ok(by_agent
            .into_iter()
            .flat_map(|(agent, msgs)| msgs.into_iter().map(move |m| (agent.clone(), m)))
            .collect())
    }
}

/// A registered region; the handle is declared first so it deregisters
/// before the memory is freed.
struct Registered {
    _handle: RegistrationHandle,
    region: Arc<HostRegion>,
}

/// Slots in host regions registered with one agent, a region added at a time
/// (never past the cap), so memory is registered once, not per image.
pub struct RegisteredPool {
    pub pool: Pool,
    regions: Vec<Registered>,
    cap: usize,
    region_bytes: usize,
}

/// A slot and the region it lives in.
pub struct Allocation {
    pub slot: Slot,
    pub region: Arc<HostRegion>,
    /// A region was added (the agent's metadata changed).
    pub grew: bool,
}

impl RegisteredPool {
    pub fn new(cap: usize, region_bytes: usize) -> RegisteredPool {
        RegisteredPool {
            pool: Pool::new(),
            regions: Vec::new(),
            cap,
            region_bytes: region_bytes.max(1),
        }
    }

    /// Allocates `len` bytes, registering a new region when nothing fits and
    /// the cap allows; `None` when the pool is full.
    pub fn allocate(
        &mut self,
        agent: &Agent,
        len: usize,
        expires: Option<Instant>,
    ) -> Result<Option<Allocation>> {
        let mut grew = false;
        loop {
            if let Some(slot) = self.pool.allocate(len, expires) {
                let region = Arc::clone(&self.regions[slot.region].region);
                return Ok(Some(Allocation { slot, region, grew }));
            }
            let size = self.region_bytes.max(len).div_ceil(PAGE) * PAGE;
            if grew || self.pool.region_bytes() + size > self.cap {
                return Ok(None);
            }
            let region = Arc::new(HostRegion::new(size)?);
            let handle = agent.register(region.as_ref())?;
            self.regions.push(Registered {
                _handle: handle,
                region,
            });
            self.pool.add_region(size);
            grew = true;
        }
    }

    pub fn region(&self, index: usize) -> &HostRegion {
        &self.regions[index].region
    }
}
