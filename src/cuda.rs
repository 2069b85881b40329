//! Host-to-device copies through the CUDA driver API, for reads whose
//! destination is GPU memory: each chunk of a READ into pinned host memory
//! is copied on to the device as soon as it lands, from the reading thread,
//! with no Python in the loop.
//!
//! The driver (`libcuda.so.1`) is loaded when the first copy is asked for,
//! so the crate builds and runs on machines without CUDA; there the copier
//! cannot be made and says why. The copies go into the device's primary
//! context (the one PyTorch and the CUDA runtime use) on the caller's
//! stream.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use nixl_sys::MemType;

use crate::agent::ReadError;
use crate::errors::{Error, Result};
use crate::reader::{Reader, Source};

type CuResult = c_int;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuEvent = *mut c_void;
type CuDevicePtr = u64;
const CUDA_SUCCESS: CuResult = 0;
/// `CU_EVENT_DISABLE_TIMING`: an event only ordered against, never timed
/// (the cheaper kind to record and wait on).
const EVENT_DISABLE_TIMING: c_uint = 0x2;

/// The driver entry points pixelwire calls.
struct Driver {
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, c_int) -> CuResult,
    ctx_push: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_pop: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    memcpy_htod_async:
        unsafe extern "C" fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    event_create: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(CuEvent, CuStream) -> CuResult,
    event_destroy: unsafe extern "C" fn(CuEvent) -> CuResult,
    stream_wait_event: unsafe extern "C" fn(CuStream, CuEvent, c_uint) -> CuResult,
    error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// Primary contexts retained so far, by device ordinal (kept for the
    /// life of the process, as the CUDA runtime keeps them).
    contexts: Mutex<Vec<(c_int, usize)>>,
}

// SAFETY: the driver API is thread-safe; the struct holds function
// pointers and context handles (opaque, valid in any thread).
unsafe impl Send for Driver {}
unsafe impl Sync for Driver {}

fn symbol<T: Copy>(library: *mut c_void, name: &CStr) -> std::result::Result<T, String> {
    // SAFETY: `library` is a live dlopen handle; a found symbol is the
    // driver function of that name, whose C signature `T` spells.
    let found = unsafe { libc::dlsym(library, name.as_ptr()) };
    if found.is_null() {
        return Err(format!("the CUDA driver has no {name:?}"));
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&found) })
}

fn load() -> std::result::Result<Driver, String> {
    // SAFETY: dlopen of the system's driver library; never closed.
    let library =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if library.is_null() {
        return Err("the CUDA driver (libcuda.so.1) cannot be loaded on this machine".into());
    }
    let init: unsafe extern "C" fn(c_uint) -> CuResult = symbol(library, c"cuInit")?;
    let driver = Driver {
        device_get: symbol(library, c"cuDeviceGet")?,
        primary_ctx_retain: symbol(library, c"cuDevicePrimaryCtxRetain")?,
        ctx_push: symbol(library, c"cuCtxPushCurrent_v2")?,
        ctx_pop: symbol(library, c"cuCtxPopCurrent_v2")?,
        memcpy_htod_async: symbol(library, c"cuMemcpyHtoDAsync_v2")?,
        stream_synchronize: symbol(library, c"cuStreamSynchronize")?,
        event_create: symbol(library, c"cuEventCreate")?,
        event_record: symbol(library, c"cuEventRecord")?,
        event_destroy: symbol(library, c"cuEventDestroy_v2")?,
        stream_wait_event: symbol(library, c"cuStreamWaitEvent")?,
        error_string: symbol(library, c"cuGetErrorString")?,
        contexts: Mutex::new(Vec::new()),
    };
    // SAFETY: cuInit may be called any number of times.
    let status = unsafe { init(0) };
    driver.check(status, "cuInit").map_err(|e| e.to_string())?;
    Ok(driver)
}

fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(load)
        .as_ref()
        .map_err(|e| Error::Transfer(e.clone()))
}

impl Driver {
    fn check(&self, status: CuResult, what: &str) -> Result<()> {
        if status == CUDA_SUCCESS {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a static string or leaves null.
        let described =
            unsafe { (self.error_string)(status, &mut text) } == CUDA_SUCCESS && !text.is_null();
        let reason = if described {
            // SAFETY: a NUL-terminated static string from the driver.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("error {status}")
        };
        Err(Error::Transfer(format!("CUDA {what} failed: {reason}")))
    }

    fn primary_context(&self, ordinal: c_int) -> Result<CuContext> {
        let mut contexts = self.contexts.lock();
        if let Some(&(_, ctx)) = contexts.iter().find(|(o, _)| *o == ordinal) {
            return Ok(ctx as CuContext);
        }
        let mut device: c_int = 0;
        // SAFETY: out-pointers to locals.
        self.check(
            unsafe { (self.device_get)(&mut device, ordinal) },
            "cuDeviceGet",
        )?;
        let mut ctx: CuContext = std::ptr::null_mut();
        self.check(
            unsafe { (self.primary_ctx_retain)(&mut ctx, device) },
            "cuDevicePrimaryCtxRetain",
        )?;
        contexts.push((ordinal, ctx as usize));
        Ok(ctx)
    }
}

/// Copies host memory to one device's memory on one stream. Made on the
/// thread that copies; the device's primary context is current on that
/// thread while the copier lives (and the previous one again after).
pub struct DeviceCopier {
    driver: &'static Driver,
    stream: CuStream,
    // The context is thread-bound: the copier must not change threads.
    _not_send: std::marker::PhantomData<*mut ()>,
}

impl DeviceCopier {
    /// A copier onto device `ordinal`, queueing on `stream` (a `CUstream`
    /// / `cudaStream_t` handle of that device; 0 is the legacy default
    /// stream).
    pub fn new(ordinal: u32, stream: usize) -> Result<DeviceCopier> {
        let ordinal = c_int::try_from(ordinal)
            .map_err(|_| Error::InvalidArgument(format!("no CUDA device {ordinal}")))?;
        let driver = driver()?;
        let ctx = driver.primary_context(ordinal)?;
        // SAFETY: a retained primary context.
        driver.check(unsafe { (driver.ctx_push)(ctx) }, "cuCtxPushCurrent")?;
        Ok(DeviceCopier {
            driver,
            stream: stream as CuStream,
            _not_send: std::marker::PhantomData,
        })
    }

    /// Queues a copy of `len` bytes from host `from` to device `to`.
    ///
    /// # Safety
    /// `from..from+len` must stay readable, and `to..to+len` device memory
    /// of this copier's device, until the stream has run the copy
    /// ([`DeviceCopier::synchronize`] returns, or a later wait on the stream).
    pub unsafe fn copy(&self, to: u64, from: usize, len: usize) -> Result<()> {
        let status = (self.driver.memcpy_htod_async)(to, from as *const c_void, len, self.stream);
        self.driver.check(status, "cuMemcpyHtoDAsync")
    }

    /// Waits for every copy queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the caller's stream handle, in the current context.
        let status = unsafe { (self.driver.stream_synchronize)(self.stream) };
        self.driver.check(status, "cuStreamSynchronize")
    }

    /// Makes `waiter` (a stream handle of this device) wait for every copy
    /// queued on the copier's stream so far, without waiting here.
    pub fn order_before(&self, waiter: usize) -> Result<()> {
        let driver = self.driver;
        let mut event: CuEvent = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local; the context is current.
        driver.check(
            unsafe { (driver.event_create)(&mut event, EVENT_DISABLE_TIMING) },
            "cuEventCreate",
        )?;
        // SAFETY: a live event and the caller's stream handles. Destroying
        // an event that a stream still waits on is allowed: the driver
        // frees it once the wait has passed it.
        let outcome = driver
            .check(
                unsafe { (driver.event_record)(event, self.stream) },
                "cuEventRecord",
            )
            .and_then(|()| {
                driver.check(
                    unsafe { (driver.stream_wait_event)(waiter as CuStream, event, 0) },
                    "cuStreamWaitEvent",
                )
            });
        let _ = unsafe { (driver.event_destroy)(event) };
        outcome
    }
}

impl Drop for DeviceCopier {
    fn drop(&mut self) {
        let mut previous: CuContext = std::ptr::null_mut();
        // SAFETY: pops the context `new` pushed on this thread.
        let _ = unsafe { (self.driver.ctx_pop)(&mut previous) };
    }
}

/// Where a read's device copies go: device memory at `addr` (room for the
/// image), and the stream, if any, to order after the copies (the caller's,
/// so what it runs next sees the pixels).
#[derive(Clone, Copy, Debug)]
pub struct Destination {
    pub addr: u64,
    pub ready_on: Option<usize>,
}

enum Handoff {
    Pending,
    Given(Destination),
    Withheld,
}

/// A read's [`Destination`], given after the read has started: the caller
/// allocates device memory while the READ runs, and the first chunk to land
/// waits for it. Given once; a caller that has none withholds it (dropping
/// its handle does), and the read then copies nothing and fails.
pub struct DestinationCell {
    state: Mutex<Handoff>,
    settled: Condvar,
}

impl Default for DestinationCell {
    fn default() -> Self {
        DestinationCell {
            state: Mutex::new(Handoff::Pending),
            settled: Condvar::new(),
        }
    }
}

impl DestinationCell {
    /// Gives the destination; refused once given or withheld.
    pub fn give(&self, destination: Destination) -> Result<()> {
        let mut state = self.state.lock();
        if !matches!(*state, Handoff::Pending) {
            return Err(Error::InvalidArgument(
                "this read's device destination was already given or withheld".into(),
            ));
        }
        *state = Handoff::Given(destination);
        self.settled.notify_all();
        Ok(())
    }

    /// Says there will be no destination (nothing happens once given).
    pub fn withhold(&self) {
        let mut state = self.state.lock();
        if matches!(*state, Handoff::Pending) {
            *state = Handoff::Withheld;
            self.settled.notify_all();
        }
    }

    /// The destination once given; None if withheld, or not given by
    /// `deadline` (it is withheld then, so a late one is refused).
    fn wait(&self, deadline: Instant) -> Option<Destination> {
        let mut state = self.state.lock();
        while matches!(*state, Handoff::Pending) {
            if self.settled.wait_until(&mut state, deadline).timed_out()
                && matches!(*state, Handoff::Pending)
            {
                *state = Handoff::Withheld;
            }
        }
        match *state {
            Handoff::Given(destination) => Some(destination),
            _ => None,
        }
    }
}

/// READs `source` into registered host memory at `staging` (room for the
/// image) in chunks of `chunk` bytes, copying each chunk on to device
/// `device`'s memory at the `destination` given meanwhile, on `stream`, as
/// it lands ([`Reader::read_into`]: slot header, and content hash when the
/// reader verifies). Only `Ok` says the device bytes are the published
/// ones, and then in `stream`'s order: the copies are queued, not waited
/// for, so the last chunk's copy overlaps whatever the caller does next;
/// the destination's `ready_on` stream is made to wait for them. On an
/// error every copy has ended before the return, so the caller may drop
/// both buffers at once. A destination withheld, or not given within the
/// reader's timeout, is an error (the READ still ends; nothing is copied).
///
/// Copies still queued from an earlier call on the same stream read
/// `staging`: they are waited for before the READ may write it (one
/// staging buffer a stream, as `pixelwire.Reader` keeps them).
///
/// # Safety
/// `stream` must be a stream handle of device `device`. `staging` must stay
/// registered and allocated, and the given destination device memory of
/// `device` with room for the image, until `stream` has finished the
/// copies (or, on an error with `may_land`, for as long as the READ may
/// still land); `staging` must not be read by copies queued on another
/// stream.
pub unsafe fn read_to_device(
    reader: &Reader,
    source: &Source,
    staging: usize,
    (device, stream): (u32, usize),
    destination: &DestinationCell,
    chunk: usize,
) -> std::result::Result<(), ReadError> {
    let refused = |error: Error| ReadError {
        error,
        may_land: false,
    };
    let copier = DeviceCopier::new(device, stream).map_err(refused)?;
    // The previous read's copies may still be reading the staging buffer.
    copier.synchronize().map_err(refused)?;
    let deadline = Instant::now() + reader.timeout();
    let mut resolved: Option<Option<Destination>> = None;
    let outcome = reader.read_into(
        source,
        (staging, MemType::Dram, 0),
        chunk,
        &mut |at, len| {
            let Some(to) = *resolved.get_or_insert_with(|| destination.wait(deadline)) else {
                return Ok(()); // withheld: the read fails once it has ended
            };
            // SAFETY: the chunk has landed in staging memory; both ends are
            // the caller's contract until the stream has run the copy.
            unsafe { copier.copy(to.addr + at as u64, staging + at, len) }
        },
    );
    let outcome = outcome.and_then(|()| {
        let to = resolved
            .unwrap_or_else(|| destination.wait(deadline))
            .ok_or_else(|| {
                refused(Error::Transfer(
                    "the read was given no device memory to copy into: no pixels".into(),
                ))
            })?;
        match to.ready_on {
            Some(waiter) => copier.order_before(waiter).map_err(refused),
            None => Ok(()),
        }
    });
    if outcome.is_err() {
        // Nothing may still write the device memory the caller is about to
        // drop (the READ's own landing is what `may_land` reports). The
        // read's error is the one to report: a stream that cannot be
        // waited for is a broken context, whose copies do not run either.
        let _ = copier.synchronize();
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_the_driver_gets_a_transfer_error_not_a_crash() {
        // On CI (no GPU, no libcuda) this is the error path; on a GPU
        // machine the copier is made for device 0 on the default stream.
        match DeviceCopier::new(0, 0) {
            Ok(copier) => copier.synchronize().unwrap(),
            Err(Error::Transfer(message)) => assert!(message.contains("CUDA"), "{message}"),
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }

    #[test]
    fn a_device_ordinal_past_c_int_is_refused() {
        assert!(matches!(
            DeviceCopier::new(u32::MAX, 0),
            Err(Error::InvalidArgument(_))
        ));
    }

    /// A deadline far enough that only a missed wake-up reaches it.
    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    fn at(addr: u64) -> Destination {
        Destination {
            addr,
            ready_on: None,
        }
    }

    /// `act(cell)` on another thread 20 ms from now, while this one waits.
    fn waited_while(
        act: impl FnOnce(&DestinationCell) + Send + 'static,
    ) -> (
        Option<Destination>,
        std::sync::Arc<DestinationCell>,
        std::time::Duration,
    ) {
        let cell = std::sync::Arc::new(DestinationCell::default());
        let other = std::sync::Arc::clone(&cell);
        let handle = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            act(&other);
        });
        let started = Instant::now();
        let got = cell.wait(far());
        let waited = started.elapsed();
        handle.join().unwrap();
        (got, cell, waited)
    }

    #[test]
    fn a_destination_given_from_another_thread_reaches_the_waiting_read() {
        let (got, cell, _) = waited_while(|cell| {
            cell.give(Destination {
                addr: 0x1000,
                ready_on: Some(7),
            })
            .unwrap()
        });
        let got = got.expect("given");
        assert_eq!((got.addr, got.ready_on), (0x1000, Some(7)));
        // Given once: a second destination would race the copies queued.
        assert!(matches!(
            cell.give(at(0x2000)),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(cell.wait(far()).map(|d| d.addr), Some(0x1000));
    }

    #[test]
    fn a_withheld_destination_ends_the_wait_and_refuses_a_late_one() {
        let (got, cell, waited) = waited_while(|cell| cell.withhold());
        assert!(got.is_none());
        // Woken by the withholding, not by the deadline.
        assert!(waited < std::time::Duration::from_secs(30), "{waited:?}");
        assert!(matches!(cell.give(at(1)), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn a_destination_not_given_by_the_deadline_is_withheld() {
        let cell = DestinationCell::default();
        assert!(cell
            .wait(Instant::now() + std::time::Duration::from_millis(10))
            .is_none());
        // The read has given up on it: a late one must not be copied into.
        assert!(matches!(cell.give(at(1)), Err(Error::InvalidArgument(_))));
        // Withholding after a give changes nothing.
        let given = DestinationCell::default();
        given.give(at(3)).unwrap();
        given.withhold();
        assert_eq!(given.wait(far()).map(|d| d.addr), Some(3));
    }
}
