//! Slot allocation inside a few large registered regions.
//!
//! Regions are registered once and never shrink while in use; images get
//! sub-ranges ("slots"). Every allocation carries a fresh generation, so a
//! stale release or a late reader naming an old generation cannot touch the
//! slot's next occupant. Pure bookkeeping: no NIXL here.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// Ranges are aligned so concurrent writers never share a cache line.
const ALIGN: usize = 64;

/// A live slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub id: u64,
    pub generation: u64,
    pub region: usize,
    pub offset: usize,
    pub len: usize,
    pub expires: Option<Instant>,
}

#[derive(Debug, Default)]
struct RegionSpace {
    size: usize,
    /// Free ranges, offset -> length, coalesced.
    free: BTreeMap<usize, usize>,
}

/// Why a slot left the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Its reader said it is done.
    Notified,
    /// Its lease ran out.
    Expired,
    /// The owner gave it back (decode failed, read failed, ...).
    Returned,
}

#[derive(Debug, Default)]
pub struct Pool {
    regions: Vec<RegionSpace>,
    live: HashMap<u64, Slot>,
    next_generation: u64,
    bytes_in_use: usize,
}

fn round_up(n: usize) -> usize {
    n.max(1).div_ceil(ALIGN) * ALIGN
}

impl Pool {
    pub fn new() -> Pool {
        Pool::default()
    }

    /// Adds a region of `size` bytes; returns its index.
    pub fn add_region(&mut self, size: usize) -> usize {
        let mut free = BTreeMap::new();
        free.insert(0, size);
        self.regions.push(RegionSpace { size, free });
        self.regions.len() - 1
    }

    pub fn region_bytes(&self) -> usize {
        self.regions.iter().map(|r| r.size).sum()
    }

    pub fn region_count(&self) -> usize {
        self.regions.len()
    }

    pub fn bytes_in_use(&self) -> usize {
        self.bytes_in_use
    }

    pub fn slots_in_use(&self) -> usize {
        self.live.len()
    }

    /// First fit over all regions; `None` when nothing fits.
    pub fn allocate(&mut self, len: usize, expires: Option<Instant>) -> Option<Slot> {
        let want = round_up(len);
        for (index, region) in self.regions.iter_mut().enumerate() {
            let found = region
                .free
                .iter()
                .find(|(_, &size)| size >= want)
                .map(|(&o, &s)| (o, s));
            if let Some((offset, size)) = found {
                region.free.remove(&offset);
                if size > want {
                    region.free.insert(offset + want, size - want);
                }
                self.next_generation += 1;
                let slot = Slot {
                    id: self.next_generation,
                    generation: self.next_generation,
                    region: index,
                    offset,
                    len,
                    expires,
                };
                self.live.insert(slot.id, slot);
                self.bytes_in_use += want;
                return Some(slot);
            }
        }
        None
    }

    pub fn get(&self, id: u64) -> Option<Slot> {
        self.live.get(&id).copied()
    }

    /// Frees slot `id` if it is still at `generation`; false otherwise (a
    /// stale or repeated release, which must not free anyone else's slot).
    pub fn release(&mut self, id: u64, generation: u64) -> bool {
        match self.live.get(&id) {
            Some(slot) if slot.generation == generation => {
                let slot = self.live.remove(&id).expect("present");
                self.give_back(slot);
                true
            }
            _ => false,
        }
    }

    /// Frees every slot whose lease ended before `now`; returns them.
    pub fn reclaim_expired(&mut self, now: Instant) -> Vec<Slot> {
        let expired: Vec<u64> = self
            .live
            .values()
            .filter(|s| s.expires.is_some_and(|e| e <= now))
            .map(|s| s.id)
            .collect();
        expired
            .into_iter()
            .map(|id| {
                let slot = self.live.remove(&id).expect("present");
                self.give_back(slot);
                slot
            })
            .collect()
    }

    fn give_back(&mut self, slot: Slot) {
        let len = round_up(slot.len);
        self.bytes_in_use -= len;
        let free = &mut self.regions[slot.region].free;
        let mut offset = slot.offset;
        let mut size = len;
        // Merge with the free range just before and just after.
        if let Some((&prev, &prev_len)) = free.range(..offset).next_back() {
            if prev + prev_len == offset {
                free.remove(&prev);
                offset = prev;
                size += prev_len;
            }
        }
        if let Some(&next_len) = free.get(&(offset + size)) {
            free.remove(&(offset + size));
            size += next_len;
        }
        free.insert(offset, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn allocate_release_coalesce() {
        let mut p = Pool::new();
        p.add_region(1024);
        let a = p.allocate(100, None).unwrap();
        let b = p.allocate(200, None).unwrap();
        let c = p.allocate(300, None).unwrap();
        assert!(p.allocate(600, None).is_none());
        assert!(p.release(b.id, b.generation));
        assert!(!p.release(b.id, b.generation), "double release is refused");
        assert!(p.release(a.id, a.generation));
        assert!(p.release(c.id, c.generation));
        assert_eq!(p.bytes_in_use(), 0);
        assert!(
            p.allocate(1024, None).is_some(),
            "free space coalesced back to one range"
        );
    }

    #[test]
    fn stale_generation_cannot_free_new_occupant() {
        let mut p = Pool::new();
        p.add_region(128);
        let now = Instant::now();
        let old = p.allocate(64, Some(now)).unwrap();
        assert_eq!(p.reclaim_expired(now + Duration::from_millis(1)).len(), 1);
        let new = p.allocate(64, None).unwrap();
        assert_eq!((new.region, new.offset), (old.region, old.offset));
        assert_ne!(new.generation, old.generation);
        assert!(!p.release(old.id, old.generation));
        assert_eq!(p.slots_in_use(), 1);
    }

    #[test]
    fn grows_across_regions() {
        let mut p = Pool::new();
        p.add_region(64);
        assert!(p.allocate(100, None).is_none());
        p.add_region(256);
        let s = p.allocate(100, None).unwrap();
        assert_eq!(s.region, 1);
    }
}
