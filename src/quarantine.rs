//! Memory a failed READ may still write. A READ that failed once posted
//! (timed out, or broke off with other READs into the same destination in
//! flight) can still land: its destination stays out of use until twice
//! the read timeout has passed, by when the transfer has surely ended. The
//! reader's receive slots and the caller memory it reads into (CUDA
//! staging) both follow this one rule.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Destinations held out of use, each until its quarantine ends.
pub struct Quarantine<T> {
    hold_for: Duration,
    held: Mutex<Vec<(T, Instant)>>,
}

impl<T: PartialEq> Quarantine<T> {
    /// The quarantine of a reader whose READs time out after `read_timeout`.
    pub fn new(read_timeout: Duration) -> Quarantine<T> {
        Quarantine {
            hold_for: read_timeout * 2,
            held: Mutex::new(Vec::new()),
        }
    }

    /// Holds `item` from now until its quarantine ends.
    pub fn hold(&self, item: T) {
        self.hold_at(item, Instant::now());
    }

    fn hold_at(&self, item: T, now: Instant) {
        self.held.lock().push((item, now + self.hold_for));
    }

    /// Lets go of every item whose quarantine has ended by `now`, handing
    /// each to `release`.
    pub fn end_due(&self, now: Instant, mut release: impl FnMut(T)) {
        let mut held = self.held.lock();
        if held.iter().all(|(_, until)| *until > now) {
            return;
        }
        let (due, kept): (Vec<_>, Vec<_>) = held.drain(..).partition(|(_, until)| *until <= now);
        *held = kept;
        drop(held);
        for (item, _) in due {
            release(item);
        }
    }

    /// Whether `item` is held.
    pub fn holds(&self, item: &T) -> bool {
        self.held.lock().iter().any(|(held, _)| held == item)
    }

    /// How many items are held.
    pub fn len(&self) -> usize {
        self.held.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_held_for_twice_the_read_timeout() {
        let quarantine = Quarantine::new(Duration::from_secs(5));
        let now = Instant::now();
        quarantine.hold_at(7, now);
        quarantine.hold_at(8, now + Duration::from_secs(1));
        let mut released = Vec::new();
        quarantine.end_due(now + Duration::from_millis(9999), |i| released.push(i));
        assert!(released.is_empty(), "still within twice the timeout");
        assert!(quarantine.holds(&7) && quarantine.holds(&8));
        quarantine.end_due(now + Duration::from_secs(10), |i| released.push(i));
        assert_eq!(released, vec![7]);
        assert!(!quarantine.holds(&7));
        assert_eq!(quarantine.len(), 1);
        quarantine.end_due(now + Duration::from_secs(11), |i| released.push(i));
        assert_eq!(released, vec![7, 8]);
        assert!(quarantine.is_empty());
    }
}
