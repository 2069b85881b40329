//! The memory NIXL moves bytes between: page-aligned host regions of ours,
//! caller memory (a CUDA tensor) described for registration, and the pool
//! of slots in host regions registered with one agent. The slot
//! bookkeeping itself is `pool.rs` (no NIXL there); this module adds the
//! registration and the lock around it.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor, RegistrationHandle};
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::agent::{Agent, PAGE};
use crate::errors::{Error, Result};
use crate::pool::{Pool, Slot};
use crate::wire::{SlotHeader, SLOT_HEADER_BYTES};

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
    /// The version at which a region was last deregistered (0: never):
    /// between later versions the set only grew, so a reader that knows an
    /// older set may add the new regions to it instead of reconnecting.
    pruned: u64,
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
            pruned: 0,
        }
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn pruned(&self) -> u64 {
        self.pruned
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
                self.pruned = self.version;
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
        self.acquire_with(
            len,
            deadline,
            tidy,
            |_| false,
            |size| Registered::new(agent, size),
        )
    }

    /// [`SlotPool::acquire`] where `make_room` runs under the lock whenever
    /// nothing fits, before any wait: true when it gave something up (a
    /// cache pin), and the pool looks again at once.
    pub fn acquire_making_room(
        &self,
        agent: &Agent,
        len: usize,
        deadline: Instant,
        make_room: impl FnMut(&mut RegisteredPool) -> bool,
    ) -> Result<Option<Allocation>> {
        self.acquire_with(
            len,
            deadline,
            |_| {},
            make_room,
            |size| Registered::new(agent, size),
        )
    }

    fn acquire_with(
        &self,
        len: usize,
        deadline: Instant,
        mut tidy: impl FnMut(&mut RegisteredPool),
        mut make_room: impl FnMut(&mut RegisteredPool) -> bool,
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
                        // Callers waiting for room see the new region at once.
                        Ok(registered) => {
                            state.add(registered);
                            self.freed.notify_all();
                        }
                        Err(e) => {
                            state.growing -= size;
                            self.freed.notify_all();
                            return Err(e);
                        }
                    }
                }
                Step::Wait => {
                    if make_room(&mut state) {
                        continue;
                    }
                    if !retired.is_empty() {
                        MutexGuard::unlocked(&mut state, || retired.clear());
                        continue;
                    }
                    // Room another caller is registering is room the pool
                    // has: wait for it past the deadline (a registration
                    // ends, in a region or an error) rather than refuse the
                    // image. Under load a first burst of reads waited on its
                    // regions' registration past a 5 s READ timeout.
                    let now = Instant::now();
                    if now >= deadline && state.growing == 0 {
                        return Ok(None);
                    }
                    // Bounded waits: quarantines end without a signal (past
                    // the deadline, a registration's end wakes the waiters).
                    let step = now + Duration::from_millis(100);
                    let until = if now >= deadline {
                        step
                    } else {
                        deadline.min(step)
                    };
                    self.freed.wait_until(&mut state, until);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    type Grower = std::thread::JoinHandle<Result<Option<Allocation>>>;

    /// A thread taking 1000 bytes of `pool` whose region's registration
    /// waits (once it has begun) until the returned sender is sent to.
    fn grow_blocked(pool: &Arc<SlotPool>) -> (Grower, mpsc::Sender<()>) {
        let (entered, registering) = mpsc::channel();
        let (finish, go_on) = mpsc::channel::<()>();
        let grower = {
            let pool = Arc::clone(pool);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(30);
                pool.acquire_with(
                    1000,
                    deadline,
                    |_| {},
                    |_| false,
                    |size| {
                        entered.send(()).unwrap();
                        go_on.recv().unwrap();
                        Registered::unregistered(size)
                    },
                )
            })
        };
        registering.recv().unwrap();
        (grower, finish)
    }

    #[test]
    fn the_pool_lock_is_free_while_a_region_registers() {
        let pool = Arc::new(SlotPool::new(1 << 20, 64 << 10));
        let (grower, finish) = grow_blocked(&pool);
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
    fn a_caller_waits_for_room_another_is_registering_past_its_deadline() {
        // One region's room: the second caller must wait for the first's
        // registration, which ends after the second's deadline.
        let pool = Arc::new(SlotPool::new(64 << 10, 64 << 10));
        let (grower, finish) = grow_blocked(&pool);
        let waiter = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_millis(50);
                pool.acquire_with(1000, deadline, |_| {}, |_| false, Registered::unregistered)
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        finish.send(()).unwrap();
        assert!(grower.join().unwrap().unwrap().is_some());
        let waited = waiter.join().unwrap().unwrap();
        assert!(
            waited.is_some(),
            "refused while the room it needed was registering"
        );
    }

    #[test]
    fn empty_regions_give_way_to_a_larger_image() {
        let pool = SlotPool::new(256 << 10, 64 << 10);
        let soon = || Instant::now() + Duration::from_millis(200);
        let register = |size| Registered::unregistered(size);
        let held: Vec<_> = (0..4)
            .map(|_| {
                pool.acquire_with(40 << 10, soon(), |_| {}, |_| false, register)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        assert_eq!(pool.lock().pool.region_count(), 4);
        assert!(
            pool.acquire_with(200 << 10, soon(), |_| {}, |_| false, register)
                .unwrap()
                .is_none(),
            "no room while every region holds a slot"
        );
        for a in &held {
            assert!(pool.lock().pool.release(a.slot.id, a.slot.generation));
        }
        let large = pool
            .acquire_with(200 << 10, soon(), |_| {}, |_| false, register)
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
