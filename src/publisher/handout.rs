//! A published slot's hand-outs: a cache pins the slot and hands it out
//! again (each hand-out its own number, lease and notification); a hand-out
//! ends by its release, its reader's notification or its lease, and the slot
//! is freed, its header marked free under the pool lock, when its pin is
//! gone and no hand-out is outstanding.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::{read_margin, unix_now, Metadata, Publisher, Shared};
use crate::pool::{Ended, Slot};
use crate::region::RegisteredPool;

/// One more hand-out of a pinned slot: what its descriptor needs anew.
#[derive(Clone, Debug)]
pub struct HandOut {
    pub handout: u64,
    pub expires_at: f64,
    pub metadata: String,
    pub metadata_version: u64,
    pub metadata_pruned: u64,
}

impl Publisher {
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
        self.shared
            .settle(ended, &self.shared.counters.freed_by_eviction)
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

    /// Ends hand-out `handout` of a slot (its request is over); the slot
    /// is freed if nothing else holds it. False when that hand-out had
    /// ended already (a notification, its lease, an earlier release).
    pub fn release(&self, slot: u64, generation: u64, handout: u64) -> bool {
        let ended = {
            let mut state = self.shared.slots.lock();
            ended_locked(&mut state, slot, generation, handout)
        };
        self.shared.settle(ended, &self.shared.counters.returned)
    }
}

impl Shared {
    /// What follows a pin or hand-out ended by the caller: a slot that freed
    /// is counted on `freed` and wakes the publishes waiting for one. True
    /// unless it had ended already.
    fn settle(&self, ended: Ended, freed: &AtomicU64) -> bool {
        if let Ended::Freed(_) = ended {
            freed.fetch_add(1, Ordering::Relaxed);
            self.slots.notify_freed();
        }
        ended != Ended::Stale
    }

    /// Ends hand-out `handout` of slot `id` if it is still at
    /// `generation` (gives back a slot never published, for 0); true when
    /// that freed the slot, whose header is marked free under the same lock.
    pub(super) fn end(&self, id: u64, generation: u64, handout: u64) -> bool {
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
    pub(super) fn evict_one(&self, state: &mut RegisteredPool) -> bool {
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
}

/// Ends a hand-out with the pool lock held; a slot that frees has its
/// header marked free before the lock is let go.
pub(super) fn ended_locked(
    state: &mut RegisteredPool,
    id: u64,
    generation: u64,
    handout: u64,
) -> Ended {
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
