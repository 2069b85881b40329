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
//!
//! The parts, one concern each: this file holds the publisher itself (its
//! configuration, what it shares with its thread, the descriptors it hands
//! back); `publish` takes slots, fills and publishes them, alone or as a
//! cancellable batch; `handout` pins slots for a cache, hands them out again
//! and ends hand-outs; `poller` is the notification thread that ends
//! hand-outs as readers report their READs and reclaims ended leases.

mod handout;
mod poller;
mod publish;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};

use crate::agent::{Agent, AgentOptions};
use crate::decode::{ImageInfo, OutputShape};
use crate::errors::{Error, Result};
use crate::region::SlotPool;
use crate::wire;

pub use handout::HandOut;
use poller::PollerWake;
pub(crate) use publish::cancelled;
pub use publish::{BatchControl, BatchImage, Packing};

/// The shortest lease that can work: a descriptor must outlive the trip to
/// the worker and its READ.
pub const MIN_LEASE: Duration = Duration::from_millis(500);

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
}
