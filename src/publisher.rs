//! Frontend side: decode straight into registered memory and describe it.
//!
//! A slot's life: taken (no lease yet) → decoded into → published (header
//! written, hand-out 0 and its lease started) → optionally pinned by a cache,
//! which hands it out again (each hand-out its own number, lease and
//! notification) → freed exactly once, when its pin is gone (evicted) and
//! every hand-out has ended: by its reader's notification, by its owner, or
//! by the reaper when its lease ends. Every free marks the slot header free
//! under the pool lock before the range can be taken again, so a READ still
//! in flight on it fails the reader's check.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::agent::{Agent, AgentOptions};
use crate::decode::{self, DecodeOptions, ImageInfo, Mode, OutputShape};
use crate::errors::{Error, Result};
use crate::fair::FairPool;
use crate::patches::PatchGrid;
use crate::pool::{Ended, Slot};
use crate::region::{RegisteredPool, SlotPool};
use crate::wire::{self, SlotHeader, SLOT_HEADER_BYTES};

/// The shortest lease that can work: a descriptor must outlive the trip to
/// the worker and its READ.
pub const MIN_LEASE: Duration = Duration::from_millis(500);

/// A single image of at most this many pixels is published on the caller's
/// thread (4 MP: a 1440p photo, about 15 ms to decode); a larger one waits
/// its turn on the publish pool, whose threads yield to the caller's.
const INLINE_PIXELS: u64 = 4_000_000;

/// How often a publish waiting for a slot looks whether its batch was cancelled.
const CANCEL_CHECK: Duration = Duration::from_millis(20);

/// How long before the reclaim a lease is advertised to end: reads that
/// start after the advertised end are refused by the reader, so a READ in
/// flight when the slot is taken back is rare (and caught by the header).
pub fn read_margin(lease: Duration) -> Duration {
    (lease / 4).min(Duration::from_secs(5))
}

#[derive(Clone, Copy, Debug)]
pub struct PublisherConfig {
    /// Cap on registered memory; regions are added up to it, never past.
    pub pool_bytes: usize,
    /// Size of each region added (a larger image gets a region of its own size).
    pub region_bytes: usize,
    pub lease: Duration,
    pub acquire_timeout: Duration,
}

/// One published image.
#[derive(Clone, Debug)]
pub struct Published {
    pub info: ImageInfo,
    /// Decoded size before any resize (EXIF orientation applied).
    pub source_shape: OutputShape,
    pub shape: OutputShape,
    pub slot: PublishedSlot,
}

/// One published slot, whatever the caller wrote into it.
#[derive(Clone, Debug)]
pub struct PublishedSlot {
    pub slot: u64,
    pub generation: u64,
    /// Address of the bytes; the slot header is the bytes just before.
    pub addr: usize,
    pub len: usize,
    pub content_hash: String,
    /// Which hand-out of the slot this is (0: the publish's own).
    pub handout: u64,
    /// Unix time after which readers must not start a READ: the lease's end
    /// less [`read_margin`], so never later than the reclaim.
    pub expires_at: f64,
    /// The agent metadata that describes the slot, and its version (it only
    /// grows; a reader keeps the newest it has seen).
    pub metadata: String,
    pub metadata_version: u64,
    /// The last version at which a region was deregistered: a reader that
    /// has loaded this version or a later one may add what is new to it.
    pub metadata_pruned: u64,
}

/// One image of a [`Publisher::publish_many`] batch.
#[derive(Clone, Copy, Debug)]
pub struct BatchImage<'a> {
    /// The encoded image.
    pub data: &'a [u8],
    /// The size to resize it to right after decoding, if any.
    pub resize: Option<crate::resize::Target>,
}

/// How a published image's bytes are laid out in its slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Packing {
    /// Height x width x channels, as decoded.
    Hwc,
    /// RGB in four bytes a pixel, Pillow's in-memory layout, so a reader
    /// building a PIL image maps the pixels instead of copying them.
    Rgbx,
    /// The patch rows a processor makes of the (resized) image
    /// ([`crate::patches`]): its processed inputs, `rows x row_len` values.
    Patches(PatchGrid),
}

/// What the owner of a [`Publisher::publish_many`] batch can take back while
/// it runs: [`Publisher::cancel`] stops the images not yet started, ends
/// their waits for a slot, and frees every slot the batch has published so
/// far and each one it publishes after (the owner will never hand them out).
#[derive(Default)]
pub struct BatchControl {
    state: Mutex<ControlState>,
    /// Set with `cancelled`, for native work that polls it without the
    /// lock (a video's decoder: `crate::video::Capture`).
    stop: Arc<AtomicI32>,
}

#[derive(Default)]
struct ControlState {
    cancelled: bool,
    /// (slot, generation) of what the batch published while not cancelled.
    published: Vec<(u64, u64)>,
}

impl BatchControl {
    pub fn is_cancelled(&self) -> bool {
        self.state.lock().cancelled
    }

    /// The flag a cancel sets, for work that polls it natively.
    pub fn stop_flag(&self) -> Arc<AtomicI32> {
        self.stop.clone()
    }

    /// Cancels work that published nothing ([`Publisher::cancel`] also
    /// frees what a batch published).
    pub fn stop(&self) {
        self.state.lock().cancelled = true;
        self.stop.store(1, Ordering::Relaxed);
    }
}

/// One more hand-out of a pinned slot: what its descriptor needs anew.
#[derive(Clone, Debug)]
pub struct HandOut {
    pub handout: u64,
    pub expires_at: f64,
    pub metadata: String,
    pub metadata_version: u64,
    pub metadata_pruned: u64,
}

#[derive(Default)]
pub struct Counters {
    pub published: AtomicU64,
    /// Hand-outs of a pinned slot after its publish (cache hits).
    pub handed_out: AtomicU64,
    /// Pins taken off to keep the pinned bytes within budget or to make room.
    pub evicted: AtomicU64,
    /// Slots freed when their pin was taken off (no hand-out outstanding).
    pub freed_by_eviction: AtomicU64,
    pub freed_by_notification: AtomicU64,
    pub reclaimed_by_lease: AtomicU64,
    pub returned: AtomicU64,
    pub stale_notifications: AtomicU64,
}

/// The agent's metadata as shipped in descriptors.
#[derive(Clone)]
struct Metadata {
    version: u64,
    /// The registered set's [`crate::region::RegisteredPool::pruned`] when
    /// the metadata was exported.
    pruned: u64,
    packed: String,
}

struct Shared {
    // Field order is drop order: regions deregister before the agent goes.
    slots: SlotPool,
    /// The agent metadata, replaced only by a newer version.
    metadata: RwLock<Metadata>,
    counters: Counters,
    /// (slot, generation) of pins taken off since the cache last asked.
    evicted: Mutex<Vec<(u64, u64)>>,
    stop: AtomicBool,
    /// Wakes the notification thread from its idle wait: a lease started,
    /// or the publisher is closing.
    poller_wake: PollerWake,
    config: PublisherConfig,
    agent: Agent,
}

pub struct Publisher {
    shared: Arc<Shared>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Publisher {
    pub fn new(config: PublisherConfig) -> Result<Publisher> {
        if config.lease < MIN_LEASE {
            return Err(Error::InvalidArgument(format!(
                "lease_seconds must be at least {} (got {}): a shorter lease frees slots before a worker can read them",
                MIN_LEASE.as_secs_f64(),
                config.lease.as_secs_f64()
            )));
        }
        let agent = Agent::new("front", &AgentOptions::default())?;
        let metadata = wire::pack_metadata(&agent.local_metadata()?);
        let shared = Arc::new(Shared {
            slots: SlotPool::new(config.pool_bytes, config.region_bytes),
            metadata: RwLock::new(Metadata {
                version: 0,
                pruned: 0,
                packed: metadata,
            }),
            counters: Counters::default(),
            evicted: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            poller_wake: PollerWake::default(),
            config,
            agent,
        });
        let for_poller = Arc::clone(&shared);
        let poller = std::thread::Builder::new()
            .name("pixelwire-publisher".into())
            .spawn(move || for_poller.poll_until_stopped())
            .map_err(|e| Error::Transfer(format!("cannot start the notification thread: {e}")))?;
        Ok(Publisher {
            shared,
            poller: Mutex::new(Some(poller)),
        })
    }

    pub fn agent_name(&self) -> &str {
        self.shared.agent.name()
    }

    /// `"b64:" + base64(zlib(agent metadata))`, recomputed only when the
    /// registered set changes.
    pub fn metadata(&self) -> String {
        self.shared.metadata.read().packed.clone()
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// (slots in use, bytes in use, registered bytes, regions).
    pub fn usage(&self) -> (usize, usize, usize, usize) {
        let state = self.shared.slots.lock();
        (
            state.pool.slots_in_use(),
            state.pool.bytes_in_use(),
            state.pool.region_bytes(),
            state.pool.region_count(),
        )
    }

    /// (pinned slots, their bytes, hand-outs not yet ended).
    pub fn holds(&self) -> (usize, usize, usize) {
        let state = self.shared.slots.lock();
        (
            state.pool.pinned_slots(),
            state.pool.pinned_bytes(),
            state.pool.outstanding_handouts(),
        )
    }

    /// Pins a published slot for a cache (see [`crate::pool::Pool::pin`]):
    /// the least recently used pins go to keep the pinned bytes within
    /// `budget`, and a publish that finds the pool full takes pins off
    /// before it waits. False when the slot cannot be pinned (gone, pinned
    /// already, or larger than `budget`).
    pub fn pin(&self, slot: u64, generation: u64, budget: usize) -> bool {
        let mut evicted = Vec::new();
        let pinned = {
            let mut state = self.shared.slots.lock();
            let pinned = state.pool.pin(slot, generation, budget, &mut evicted);
            for (gone, freed) in &evicted {
                if *freed {
                    // SAFETY: the pool lock is held, so no new owner has the range.
                    unsafe { state.region(gone.region).clear_slot_header(gone.offset) };
                }
            }
            pinned
        };
        self.shared.evicted_now(&evicted);
        if evicted.iter().any(|(_, freed)| *freed) {
            self.shared.slots.notify_freed();
        }
        pinned
    }

    /// Takes the cache's pin off a slot; true when it was pinned.
    pub fn unpin(&self, slot: u64, generation: u64) -> bool {
        let ended = {
            let mut state = self.shared.slots.lock();
            let ended = state.pool.unpin(slot, generation);
            clear_if_freed(&state, ended);
            ended
        };
        if let Ended::Freed(_) = ended {
            self.shared
                .counters
                .freed_by_eviction
                .fetch_add(1, Ordering::Relaxed);
            self.shared.slots.notify_freed();
        }
        ended != Ended::Stale
    }

    /// Hands a pinned slot out again: a new hand-out with its own lease,
    /// from now. `None` when the slot is no longer pinned at `generation`.
    pub fn hand_out(&self, slot: u64, generation: u64) -> Option<HandOut> {
        let lease = self.shared.config.lease;
        let (now, unix) = (Instant::now(), unix_now());
        let handout = self
            .shared
            .slots
            .lock()
            .pool
            .hand_out(slot, generation, now + lease)?;
        self.shared.poller_wake.lease_started();
        self.shared
            .counters
            .handed_out
            .fetch_add(1, Ordering::Relaxed);
        // Current metadata: it describes at least the slot's region, which
        // stays registered while the slot lives.
        let Metadata {
            version,
            pruned,
            packed,
        } = self.shared.metadata.read().clone();
        Some(HandOut {
            handout,
            expires_at: unix + (lease - read_margin(lease)).as_secs_f64(),
            metadata: packed,
            metadata_version: version,
            metadata_pruned: pruned,
        })
    }

    /// (slot, generation) of every pin taken off since the last call.
    pub fn take_evicted(&self) -> Vec<(u64, u64)> {
        std::mem::take(&mut *self.shared.evicted.lock())
    }

    /// Decodes `data` into a pool slot and publishes it, laid out as
    /// `packing` says. Blocks (GIL-free) up to the acquire timeout when the
    /// pool is full.
    pub fn publish(
        &self,
        data: &[u8],
        opts: &DecodeOptions,
        packing: Packing,
        resize: Option<&crate::resize::Target>,
    ) -> Result<Published> {
        self.publish_controlled(data, opts, packing, resize, None)
    }

    fn publish_controlled(
        &self,
        data: &[u8],
        opts: &DecodeOptions,
        packing: Packing,
        resize: Option<&crate::resize::Target>,
        control: Option<&BatchControl>,
    ) -> Result<Published> {
        check_packing(opts, packing)?;
        let info = decode::probe(data, &opts.limits)?;
        let source_shape = info.output_shape(opts);
        let shape = decode::resized_shape(source_shape, resize);
        let (len, shipped) = match packing {
            Packing::Hwc => (shape.len(), shape),
            Packing::Rgbx => (shape.len() / 3 * 4, shape),
            Packing::Patches(grid) => {
                let (rows, row_len) = grid.shape(shape.height, shape.width)?;
                // A row of values, each `value_bytes` bytes (f32: 4).
                let shipped = OutputShape {
                    height: rows,
                    width: row_len,
                    channels: grid.value_bytes(),
                };
                (grid.bytes(shape.height, shape.width)?, shipped)
            }
        };
        let slot = self.publish_filled(len, control, |out| {
            match packing {
                Packing::Hwc => {
                    decode::decode_resized_into(data, &info, opts, resize, &mut out[..len])?
                }
                Packing::Rgbx => {
                    decode::decode_resized_into(
                        data,
                        &info,
                        opts,
                        resize,
                        &mut out[..shape.len()],
                    )?;
                    decode::expand_rgb_to_rgbx(out);
                }
                Packing::Patches(grid) => {
                    // The rows interleave the image's blocks: decoded whole
                    // first, then laid out into the slot.
                    let mut rgb = vec![0u8; shape.len()];
                    decode::decode_resized_into(data, &info, opts, resize, &mut rgb)?;
                    grid.write(&rgb, shape.height, shape.width, &mut out[..len])?;
                }
            }
            Ok(len)
        })?;
        Ok(Published {
            info,
            source_shape,
            shape: shipped,
            slot,
        })
    }

    /// Takes a slot of `capacity` bytes (waiting for one as
    /// [`Publisher::publish`] does), lets `fill` write it, and publishes the
    /// first `n` bytes, `n` being what `fill` returns (at most `capacity`):
    /// their content hash, the slot header and the lease. A `fill` that
    /// fails gives the slot back.
    pub fn publish_filled(
        &self,
        capacity: usize,
        control: Option<&BatchControl>,
        fill: impl FnOnce(&mut [u8]) -> Result<usize>,
    ) -> Result<PublishedSlot> {
        let (slot, region, metadata_version) = self.shared.acquire(capacity, control)?;
        let mut taken = TakenSlot {
            shared: &self.shared,
            slot,
            leased: false,
        };
        let pixels_at = slot.offset + SLOT_HEADER_BYTES;
        // SAFETY: the slot's range belongs to this call until it is published.
        let pixels = unsafe { region.slice_mut(pixels_at, capacity) };
        // A failed fill gives the slot back (`taken`'s drop).
        let len = fill(pixels)?;
        if len > capacity {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes written into a {capacity}-byte slot"
            )));
        }
        let content_hash = wire::content_hash(&pixels[..len]);
        let header = SlotHeader {
            slot: slot.id,
            generation: slot.generation,
            len: len as u64,
        };
        let lease = self.shared.config.lease;
        // One clock for the lease: it starts now, and the advertised end is
        // taken from the same moment, a margin earlier.
        let (now, unix) = (Instant::now(), unix_now());
        {
            let mut state = self.shared.slots.lock();
            // SAFETY: the slot is still ours (no lease yet, so no reaper).
            unsafe { region.write_slot_header(slot.offset, &header) };
            state
                .pool
                .start_lease(slot.id, slot.generation, now + lease);
            taken.leased = true;
        }
        self.shared.poller_wake.lease_started();
        let Metadata {
            version,
            pruned,
            packed: metadata,
        } = self.shared.metadata.read().clone();
        debug_assert!(version >= metadata_version);
        self.shared
            .counters
            .published
            .fetch_add(1, Ordering::Relaxed);
        Ok(PublishedSlot {
            slot: slot.id,
            generation: slot.generation,
            addr: region.addr() + pixels_at,
            len,
            content_hash,
            handout: 0,
            expires_at: unix + (lease - read_margin(lease)).as_secs_f64(),
            metadata,
            metadata_version: version,
            metadata_pruned: pruned,
        })
    }

    /// Publishes every image of `images` as [`Publisher::publish`] would,
    /// each with its own resize target, decoding them side by side on
    /// `pool`, which shares its threads out fairly with other callers'
    /// batches. One result per image, in input order: an image that fails
    /// (not a format decoded here, corrupt, no slot free in time, even a
    /// panicking decoder) costs only itself and keeps no slot. Each `Ok` is a
    /// published slot the caller now owns, freed as one from `publish` is;
    /// after [`Publisher::cancel`] of `control`, images not yet published
    /// fail with [`Error::Cancelled`] and those published were freed.
    /// Fails as a whole only for options no image could be published with.
    pub fn publish_many(
        &self,
        pool: &FairPool,
        images: &[BatchImage<'_>],
        opts: &DecodeOptions,
        packing: Packing,
        control: &BatchControl,
    ) -> Result<Vec<Result<Published>>> {
        check_packing(opts, packing)?;
        // A single small image is decoded on the caller's thread, at its
        // priority: nothing to overlap, and it never waits behind the pool's
        // large images. Anything larger goes through the pool's turns.
        let inline = match images {
            [image] => decode::probe(image.data, &opts.limits).map_or(true, |info| {
                info.width as u64 * info.height as u64 <= INLINE_PIXELS
            }),
            _ => false,
        };
        Ok(each_on_pool(pool, images, inline, |image| {
            if control.is_cancelled() {
                return Err(cancelled());
            }
            let published = self.publish_controlled(
                image.data,
                opts,
                packing,
                image.resize.as_ref(),
                Some(control),
            )?;
            self.keep_for(control, &published.slot)?;
            Ok(published)
        }))
    }

    /// A slot just published for `control`'s owner: recorded, so that a
    /// later [`Publisher::cancel`] frees it; freed at once, and
    /// [`Error::Cancelled`], when the owner gave it up already (nobody will
    /// read it).
    pub fn keep_for(&self, control: &BatchControl, published: &PublishedSlot) -> Result<()> {
        let mut state = control.state.lock();
        if state.cancelled {
            drop(state);
            self.release(published.slot, published.generation, 0);
            return Err(cancelled());
        }
        state.published.push((published.slot, published.generation));
        Ok(())
    }

    /// Gives up a [`Publisher::publish_many`] batch (its request went away):
    /// frees what it published, and makes the rest of it stop as soon as it
    /// can. Returns how many of its hand-outs this ended.
    pub fn cancel(&self, control: &BatchControl) -> usize {
        let published = {
            let mut state = control.state.lock();
            state.cancelled = true;
            control.stop.store(1, Ordering::Relaxed);
            std::mem::take(&mut state.published)
        };
        // Wakes the batch's images waiting for a slot, so they see it.
        self.shared.slots.notify_freed();
        published
            .into_iter()
            .filter(|&(slot, generation)| self.release(slot, generation, 0))
            .count()
    }

    /// Ends hand-out `handout` of a slot (its request is over); the slot
    /// is freed if nothing else holds it. False when that hand-out had
    /// ended already (a notification, its lease, an earlier release).
    pub fn release(&self, slot: u64, generation: u64, handout: u64) -> bool {
        let ended = {
            let mut state = self.shared.slots.lock();
            ended_locked(&mut state, slot, generation, handout)
        };
        if let Ended::Freed(_) = ended {
            self.shared
                .counters
                .returned
                .fetch_add(1, Ordering::Relaxed);
            self.shared.slots.notify_freed();
        }
        ended != Ended::Stale
    }

    /// Stops the notification thread. Registered memory goes with the last
    /// reference.
    pub fn close(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.poller_wake.wake();
        if let Some(handle) = self.poller.lock().take() {
            let _ = handle.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.close();
    }
}

fn check_packing(opts: &DecodeOptions, packing: Packing) -> Result<()> {
    match packing {
        Packing::Hwc => Ok(()),
        _ if opts.mode == Mode::Rgb => Ok(()),
        Packing::Rgbx => Err(Error::InvalidArgument(
            "the RGBX layout needs mode RGB".to_string(),
        )),
        Packing::Patches(_) => Err(Error::InvalidArgument(
            "patch rows need mode RGB".to_string(),
        )),
    }
}

/// `work` applied to every item, side by side on `pool` (on the caller's
/// thread when `inline`), one result each in input order. A `work` that panics fails only its own item: by then the other
/// items' work may be done, and only their results say what the caller now
/// owns (for a publish, which slots it must free).
fn each_on_pool<I: Sync, T: Send>(
    pool: &FairPool,
    items: &[I],
    inline: bool,
    work: impl Fn(&I) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let one = |item: &I| {
        catch_unwind(AssertUnwindSafe(|| work(item))).unwrap_or_else(|panic| {
            Err(Error::decode(format!(
                "publishing this image panicked (a bug in pixelwire): {}",
                panic_message(panic.as_ref())
            )))
        })
    };
    if inline {
        return items.iter().map(one).collect();
    }
    // One item at a time, round-robin with other batches: a large image
    // must not hold back the ones queued behind it, nor one request's
    // batch another request's.
    pool.run(items.len(), |index| one(&items[index]))
}

/// The error of work its owner gave up ([`Publisher::cancel`]).
pub(crate) fn cancelled() -> Error {
    Error::Cancelled("the batch was cancelled (its request went away)".to_string())
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

/// A slot taken for one publish. It is given back (and counted as returned)
/// when dropped before its lease starts, so a decode that fails, or a panic
/// on the way, never leaves a slot that no lease will ever reclaim.
struct TakenSlot<'a> {
    shared: &'a Shared,
    slot: Slot,
    leased: bool,
}

impl Drop for TakenSlot<'_> {
    fn drop(&mut self) {
        if !self.leased {
            self.shared.end(self.slot.id, self.slot.generation, 0);
            self.shared
                .counters
                .returned
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Shared {
    /// A slot for `len` pixel bytes plus its header, and the registered
    /// set's version it lives in (the metadata is brought up to it here).
    fn acquire(
        &self,
        len: usize,
        control: Option<&BatchControl>,
    ) -> Result<(Slot, Arc<crate::region::HostRegion>, u64)> {
        let cap = self.config.pool_bytes;
        let need = len + SLOT_HEADER_BYTES;
        if need > cap {
            return Err(Error::PoolExhausted(format!(
                "a slot of {need} bytes (pixels and header) is needed, more than the whole pool ({cap} bytes)"
            )));
        }
        let deadline = Instant::now() + self.config.acquire_timeout;
        // Waits in short steps, so a cancelled batch stops waiting at once
        // (its cancel wakes the waiters) instead of at the deadline.
        let gave_up = || control.is_some_and(BatchControl::is_cancelled);
        let a = loop {
            if gave_up() {
                return Err(cancelled());
            }
            let step = deadline.min(Instant::now() + CANCEL_CHECK);
            // A full pool takes cache pins off before it waits: cached
            // images never keep a new one out.
            let make_room = |state: &mut RegisteredPool| self.evict_one(state);
            if let Some(a) = self
                .slots
                .acquire_making_room(&self.agent, need, step, make_room)?
            {
                if gave_up() {
                    // Woken by its own cancel: the slot goes to the next caller.
                    self.end(a.slot.id, a.slot.generation, 0);
                    return Err(cancelled());
                }
                break a;
            }
            if Instant::now() >= deadline {
                return Err(Error::PoolExhausted(format!(
                    "no {need}-byte slot became free within {:?} ({} bytes in use of {cap})",
                    self.config.acquire_timeout,
                    self.slots.lock().pool.bytes_in_use()
                )));
            }
        };
        if self.metadata.read().version < a.version {
            let packed = match self.agent.local_metadata() {
                Ok(raw) => wire::pack_metadata(&raw),
                Err(e) => {
                    self.end(a.slot.id, a.slot.generation, 0);
                    return Err(e);
                }
            };
            // Read after the export, so it covers every removal the export
            // reflects (a later one only makes it larger: readers reconnect).
            let pruned = self.slots.lock().pruned();
            let mut current = self.metadata.write();
            // Exported after the change, so it describes at least a.version.
            if current.version < a.version {
                *current = Metadata {
                    version: a.version,
                    pruned,
                    packed,
                };
            }
        }
        Ok((a.slot, a.region, a.version))
    }

    /// Ends hand-out `handout` of slot `id` if it is still at
    /// `generation` (gives back a slot never published, for 0); true when
    /// that freed the slot, whose header is marked free under the same lock.
    fn end(&self, id: u64, generation: u64, handout: u64) -> bool {
        let freed = {
            let mut state = self.slots.lock();
            end_locked(&mut state, id, generation, handout)
        };
        if freed {
            self.slots.notify_freed();
        }
        freed
    }

    /// Takes the least recently used pin off (under the pool lock, as the
    /// pool's `acquire` calls it); false when nothing is pinned.
    fn evict_one(&self, state: &mut RegisteredPool) -> bool {
        let Some((slot, freed)) = state.pool.evict_oldest() else {
            return false;
        };
        if freed {
            // SAFETY: the pool lock is held, so no new owner has the range.
            unsafe { state.region(slot.region).clear_slot_header(slot.offset) };
        }
        self.evicted_now(&[(slot, freed)]);
        true
    }

    /// Records pins taken off, for the cache to forget them.
    fn evicted_now(&self, evicted: &[(Slot, bool)]) {
        if evicted.is_empty() {
            return;
        }
        self.counters
            .evicted
            .fetch_add(evicted.len() as u64, Ordering::Relaxed);
        let freed = evicted.iter().filter(|(_, freed)| *freed).count();
        self.counters
            .freed_by_eviction
            .fetch_add(freed as u64, Ordering::Relaxed);
        self.evicted
            .lock()
            .extend(evicted.iter().map(|(slot, _)| (slot.id, slot.generation)));
    }

    /// Frees slots whose lease ended.
    fn reclaim_expired(&self) -> u64 {
        let mut state = self.slots.lock();
        let slots = state.pool.reclaim_expired(Instant::now());
        for slot in &slots {
            // SAFETY: the pool lock is held, so no new owner has the range.
            unsafe { state.region(slot.region).clear_slot_header(slot.offset) };
        }
        slots.len() as u64
    }

    fn poll_until_stopped(&self) {
        let mut last_sweep = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            if let Ok(messages) = self.agent.take_notifications() {
                if !messages.is_empty() {
                    let (freed, stale) = {
                        let mut state = self.slots.lock();
                        apply_notifications(&messages, |slot, generation, handout| {
                            ended_locked(&mut state, slot, generation, handout)
                        })
                    };
                    self.counters
                        .stale_notifications
                        .fetch_add(stale, Ordering::Relaxed);
                    if freed > 0 {
                        self.counters
                            .freed_by_notification
                            .fetch_add(freed, Ordering::Relaxed);
                        self.slots.notify_freed();
                    }
                }
            }
            if last_sweep.elapsed() >= Duration::from_millis(50) {
                last_sweep = Instant::now();
                let reclaimed = self.reclaim_expired();
                if reclaimed > 0 {
                    self.counters
                        .reclaimed_by_lease
                        .fetch_add(reclaimed, Ordering::Relaxed);
                    self.slots.notify_freed();
                }
            }
            // With no hand-out outstanding no notification can free a slot
            // and no lease can end: wait for the next lease instead of
            // waking a thousand times a second for nothing.
            let idle = self.slots.lock().pool.outstanding_handouts() == 0;
            if idle {
                self.poller_wake.wait_for_lease(POLLER_IDLE_WAIT);
            } else {
                std::thread::sleep(POLLER_BUSY_INTERVAL);
            }
        }
    }
}

/// How often the notification thread looks for notifications while
/// hand-outs are outstanding: a READ's notification frees its slot at most
/// this late.
const POLLER_BUSY_INTERVAL: Duration = Duration::from_millis(1);
/// The longest the notification thread waits, with nothing handed out, for
/// a lease to start (a stale notification is counted this late at most).
const POLLER_IDLE_WAIT: Duration = Duration::from_millis(250);

/// A lease-started flag the idle notification thread waits on. The flag is
/// set under the lock before the wake, and taken under it before the wait,
/// so a lease that starts between the thread's look at the pool and its
/// wait is not missed.
#[derive(Default)]
struct PollerWake {
    started: Mutex<bool>,
    woken: Condvar,
}

impl PollerWake {
    /// A lease started: the idle notification thread must poll again.
    fn lease_started(&self) {
        self.wake();
    }

    /// Wakes the notification thread (a lease started, or the publisher is
    /// closing and it must see `stop`).
    fn wake(&self) {
        *self.started.lock() = true;
        self.woken.notify_one();
    }

    /// Waits until a lease starts (or has started since the last wait), at
    /// most `limit`.
    fn wait_for_lease(&self, limit: Duration) {
        let mut started = self.started.lock();
        if !*started {
            let _ = self.woken.wait_for(&mut started, limit);
        }
        *started = false;
    }
}

/// Ends a hand-out with the pool lock held; a slot that frees has its
/// header marked free before the lock is let go.
fn ended_locked(state: &mut RegisteredPool, id: u64, generation: u64, handout: u64) -> Ended {
    let ended = state.pool.end_handout(id, generation, handout);
    clear_if_freed(state, ended);
    ended
}

fn end_locked(state: &mut RegisteredPool, id: u64, generation: u64, handout: u64) -> bool {
    matches!(
        ended_locked(state, id, generation, handout),
        Ended::Freed(_)
    )
}

fn clear_if_freed(state: &RegisteredPool, ended: Ended) {
    if let Ended::Freed(slot) = ended {
        // SAFETY: the pool lock is held (`state` is its guard's) and the
        // range was given back under it: nobody has taken it yet.
        unsafe { state.region(slot.region).clear_slot_header(slot.offset) };
    }
}

/// Ends the hand-out each notification names: one notification per READ, so
/// a slot read by many is freed by the last of them (if not pinned).
/// (slots freed, not understood or stale); each message stands alone: a
/// malformed or repeated one is counted and skipped.
fn apply_notifications(
    messages: &[Vec<u8>],
    mut end: impl FnMut(u64, u64, u64) -> Ended,
) -> (u64, u64) {
    let (mut freed, mut stale) = (0, 0);
    for message in messages {
        let ended = wire::parse_notification(message)
            .map_or(Ended::Stale, |(slot, generation, handout)| {
                end(slot, generation, handout)
            });
        match ended {
            Ended::Freed(_) => freed += 1,
            Ended::Held => {}
            Ended::Stale => stale += 1,
        }
    }
    (freed, stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_margin_is_a_fraction_of_short_leases_and_capped() {
        assert_eq!(
            read_margin(Duration::from_secs(1)),
            Duration::from_millis(250)
        );
        assert_eq!(read_margin(Duration::from_secs(60)), Duration::from_secs(5));
    }

    #[test]
    fn each_item_has_its_own_result_in_order_and_a_panic_fails_only_its_own() {
        let pool = FairPool::shared(Some(3)).unwrap();
        let items: Vec<usize> = (0..64).collect();
        for _ in 0..5 {
            let results = each_on_pool(&pool, &items, false, |&n| match n {
                7 => panic!("item {n} panics"),
                9 => Err(Error::UnsupportedFormat(format!("item {n} fails"))),
                _ => Ok(n * 10),
            });
            assert_eq!(results.len(), items.len());
            for (n, result) in results.into_iter().enumerate() {
                match (n, result) {
                    (7, Err(Error::Decode(message))) => {
                        assert!(message.contains("panicked") && message.contains("item 7 panics"))
                    }
                    (9, Err(Error::UnsupportedFormat(message))) => {
                        assert_eq!(message, "item 9 fails")
                    }
                    (n, Ok(value)) if n != 7 && n != 9 => assert_eq!(value, n * 10),
                    (n, other) => panic!("item {n}: unexpected {other:?}"),
                }
            }
        }
        // An inline item runs on the caller's thread.
        let caller = std::thread::current().id();
        let results = each_on_pool(&pool, &[()], true, |()| Ok(std::thread::current().id()));
        assert_eq!(results, [Ok(caller)]);
    }

    #[test]
    fn a_bad_notification_costs_only_itself() {
        let mut pool = crate::pool::Pool::new();
        pool.add_region(4096);
        let a = pool.allocate(64).unwrap();
        let b = pool.allocate(64).unwrap();
        let messages = vec![
            wire::notification_for(a.id, a.generation, 0).into_bytes(),
            vec![0xff, 0xfe, b'p', b'w'],
            wire::notification_for(a.id, a.generation, 0).into_bytes(),
            wire::notification_for(b.id, b.generation, 0).into_bytes(),
        ];
        let (freed, stale) = apply_notifications(&messages, |slot, generation, handout| {
            pool.end_handout(slot, generation, handout)
        });
        assert_eq!((freed, stale), (2, 2), "the non-UTF-8 one and the repeat");
        assert_eq!(pool.slots_in_use(), 0);
    }
}
