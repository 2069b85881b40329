//! Frontend side: decode straight into registered memory and describe it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::agent::{Agent, HostRegion, RegisteredPool};
use crate::decode::{self, DecodeOptions, ImageInfo, Mode, OutputShape};
use crate::errors::{Error, Result};
use crate::pool::Slot;
use crate::wire;

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
    pub shape: OutputShape,
    pub slot: u64,
    pub generation: u64,
    pub addr: usize,
    pub len: usize,
    pub content_hash: String,
    /// Unix time the lease ends.
    pub expires_at: f64,
}

struct State {
    slots: RegisteredPool,
}

#[derive(Default)]
pub struct Counters {
    pub published: AtomicU64,
    pub freed_by_notification: AtomicU64,
    pub reclaimed_by_lease: AtomicU64,
    pub returned: AtomicU64,
    pub stale_notifications: AtomicU64,
}

struct Shared {
    // Field order is drop order: regions deregister before the agent goes.
    state: Mutex<State>,
    freed: Condvar,
    metadata: RwLock<String>,
    counters: Counters,
    stop: AtomicBool,
    config: PublisherConfig,
    agent: Agent,
}

pub struct Publisher {
    shared: Arc<Shared>,
    poller: Mutex<Option<JoinHandle<()>>>,
}

/// The notification a reader attaches to its READ so the slot can be freed.
pub fn notification_for(slot: u64, generation: u64) -> String {
    format!("pw1:{slot}:{generation}")
}

fn parse_notification(msg: &str) -> Option<(u64, u64)> {
    let mut parts = msg.strip_prefix("pw1:")?.split(':');
    let slot = parts.next()?.parse().ok()?;
    let generation = parts.next()?.parse().ok()?;
    Some((slot, generation))
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Publisher {
    pub fn new(config: PublisherConfig) -> Result<Publisher> {
        let agent = Agent::new("front")?;
        let metadata = wire::pack_metadata(&agent.local_metadata()?);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: RegisteredPool::new(config.pool_bytes, config.region_bytes),
            }),
            freed: Condvar::new(),
            metadata: RwLock::new(metadata),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
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
        self.shared.metadata.read().clone()
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// (slots in use, bytes in use, registered bytes, regions).
    pub fn usage(&self) -> (usize, usize, usize, usize) {
        let state = self.shared.state.lock();
        (
            state.slots.pool.slots_in_use(),
            state.slots.pool.bytes_in_use(),
            state.slots.pool.region_bytes(),
            state.slots.pool.region_count(),
        )
    }

    /// Decodes `data` into a pool slot and describes it. Blocks (GIL-free)
    /// up to the acquire timeout when the pool is full.
    /// Decodes into a slot and publishes it. `rgbx` (RGB only) stores each
    /// pixel in four bytes, Pillow's in-memory layout, so a reader building a
    /// PIL image maps the pixels instead of copying them.
    pub fn publish(&self, data: &[u8], opts: &DecodeOptions, rgbx: bool) -> Result<Published> {
        if rgbx && opts.mode != Mode::Rgb {
            return Err(Error::InvalidArgument(
                "the RGBX layout needs mode RGB".to_string(),
            ));
        }
        let info = decode::probe(data, &opts.limits)?;
        let shape = info.output_shape(opts);
        let len = if rgbx {
            shape.len() / 3 * 4
        } else {
            shape.len()
        };
        let (slot, region) = self.shared.acquire(len)?;
        // SAFETY: the slot's range belongs to this call until it is published.
        let pixels = unsafe { region.slice_mut(slot.offset, slot.len) };
        let decoded =
            decode::decode_into(data, &info, opts, &mut pixels[..shape.len()]).map(|()| {
                if rgbx {
                    decode::expand_rgb_to_rgbx(pixels);
                }
                wire::content_hash(pixels)
            });
        let content_hash = match decoded {
            Ok(hash) => hash,
            Err(e) => {
                self.shared.give_back(slot);
                return Err(e);
            }
        };
        self.shared
            .counters
            .published
            .fetch_add(1, Ordering::Relaxed);
        Ok(Published {
            info,
            shape,
            slot: slot.id,
            generation: slot.generation,
            addr: region.addr() + slot.offset,
            len: slot.len,
            content_hash,
            expires_at: unix_now() + self.shared.config.lease.as_secs_f64(),
        })
    }

    /// Frees a slot the caller no longer wants published.
    pub fn release(&self, slot: u64, generation: u64) -> bool {
        let freed = self
            .shared
            .state
            .lock()
            .slots
            .pool
            .release(slot, generation);
        if freed {
            self.shared
                .counters
                .returned
                .fetch_add(1, Ordering::Relaxed);
            self.shared.freed.notify_all();
        }
        freed
    }

    /// Stops the notification thread. Registered memory goes with the last
    /// reference.
    pub fn close(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
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

impl Shared {
    fn acquire(&self, len: usize) -> Result<(Slot, Arc<HostRegion>)> {
        let cap = self.config.pool_bytes;
        if len > cap {
            return Err(Error::PoolExhausted(format!(
                "image needs {len} bytes, more than the whole pool ({cap} bytes)"
            )));
        }
        let deadline = Instant::now() + self.config.acquire_timeout;
        let mut state = self.state.lock();
        loop {
            let expires = Instant::now() + self.config.lease;
            if let Some(a) = state.slots.allocate(&self.agent, len, Some(expires))? {
                if a.grew {
                    *self.metadata.write() = wire::pack_metadata(&self.agent.local_metadata()?);
                }
                return Ok((a.slot, a.region));
            }
            if self.freed.wait_until(&mut state, deadline).timed_out() {
                return Err(Error::PoolExhausted(format!(
                    "no {len}-byte slot became free within {:?} ({} bytes in use of {cap})",
                    self.config.acquire_timeout,
                    state.slots.pool.bytes_in_use()
                )));
            }
        }
    }

    fn give_back(&self, slot: Slot) {
        if self
            .state
            .lock()
            .slots
            .pool
            .release(slot.id, slot.generation)
        {
            self.counters.returned.fetch_add(1, Ordering::Relaxed);
        }
        self.freed.notify_all();
    }

    /// Frees slots whose lease ended and zeroes them, so a late reader's
    /// content-hash check fails even before the slot is reused.
    fn reclaim_expired(&self) -> u64 {
        let mut state = self.state.lock();
        let slots = state.slots.pool.reclaim_expired(Instant::now());
        for slot in &slots {
            // SAFETY: the slot was just freed and the state lock is held, so
            // no new owner can have it yet.
            unsafe {
                state
                    .slots
                    .region(slot.region)
                    .slice_mut(slot.offset, slot.len)
            }
            .fill(0);
        }
        slots.len() as u64
    }

    fn poll_until_stopped(&self) {
        let mut last_sweep = Instant::now();
        while !self.stop.load(Ordering::SeqCst) {
            let mut freed = 0;
            if let Ok(notifications) = self.agent.take_notifications() {
                let mut state = self.state.lock();
                for (_, message) in notifications {
                    match parse_notification(&message) {
                        Some((slot, generation)) if state.slots.pool.release(slot, generation) => {
                            freed += 1
                        }
                        _ => {
                            self.counters
                                .stale_notifications
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            if freed > 0 {
                self.counters
                    .freed_by_notification
                    .fetch_add(freed, Ordering::Relaxed);
                self.freed.notify_all();
            }
            if last_sweep.elapsed() >= Duration::from_millis(50) {
                last_sweep = Instant::now();
                let reclaimed = self.reclaim_expired();
                if reclaimed > 0 {
                    self.counters
                        .reclaimed_by_lease
                        .fetch_add(reclaimed, Ordering::Relaxed);
                    self.freed.notify_all();
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_round_trip() {
        assert_eq!(parse_notification(&notification_for(7, 9)), Some((7, 9)));
        assert_eq!(parse_notification("pw1:x:1"), None);
        assert_eq!(parse_notification("hello"), None);
    }
}
