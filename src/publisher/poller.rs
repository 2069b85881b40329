//! The notification thread: it ends the hand-out each reader's notification
//! names, reclaims slots whose lease ended, and sleeps while nothing is
//! handed out.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::handout::ended_locked;
use super::Shared;
use crate::pool::Ended;
use crate::wire;

impl Shared {
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

    pub(super) fn poll_until_stopped(&self) {
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
pub(super) struct PollerWake {
    started: Mutex<bool>,
    woken: Condvar,
}

impl PollerWake {
    /// A lease started: the idle notification thread must poll again.
    pub(super) fn lease_started(&self) {
        self.wake();
    }

    /// Wakes the notification thread (a lease started, or the publisher is
    /// closing and it must see `stop`).
    pub(super) fn wake(&self) {
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
