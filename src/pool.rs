//! Slot allocation inside a few large registered regions.
//!
//! Regions are registered once and never shrink while in use; images get
//! sub-ranges ("slots"). A region that holds no slot can be removed, so a
//! pool that grew for mid-size images can make room for a larger one. Every
//! allocation carries a fresh generation, so a stale release or a late reader
//! naming an old generation cannot touch the slot's next occupant. A slot has
//! no lease until it is published ([`Pool::start_lease`]): the reaper never
//! takes a slot its writer still fills. Pure bookkeeping: no NIXL here.

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
    /// Indexed by `Slot::region`; a removed region leaves `None`, reused by
    /// the next region added.
    regions: Vec<Option<RegionSpace>>,
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
        let space = Some(RegionSpace { size, free });
        match self.regions.iter().position(Option::is_none) {
            Some(index) => {
                self.regions[index] = space;
                index
            }
            None => {
                self.regions.push(space);
                self.regions.len() - 1
            }
        }
    }

    /// Regions that hold no slot, as (index, size).
    pub fn empty_regions(&self) -> Vec<(usize, usize)> {
        self.regions
            .iter()
            .enumerate()
            .filter_map(|(index, r)| r.as_ref().map(|r| (index, r)))
            .filter(|(_, r)| r.free.get(&0) == Some(&r.size))
            .map(|(index, r)| (index, r.size))
            .collect()
    }

    /// Removes an empty region; false (and nothing changes) if it holds a
    /// slot or does not exist.
    pub fn remove_region(&mut self, index: usize) -> bool {
        match self.regions.get(index) {
            Some(Some(r)) if r.free.get(&0) == Some(&r.size) => {
                self.regions[index] = None;
                true
            }
            _ => false,
        }
    }

    pub fn region_bytes(&self) -> usize {
        self.regions.iter().flatten().map(|r| r.size).sum()
    }

    pub fn region_count(&self) -> usize {
        self.regions.iter().flatten().count()
    }

    pub fn bytes_in_use(&self) -> usize {
        self.bytes_in_use
    }

    pub fn slots_in_use(&self) -> usize {
        self.live.len()
    }

    /// First fit over all regions; `None` when nothing fits. The slot has no
    /// lease until [`Pool::start_lease`].
    pub fn allocate(&mut self, len: usize) -> Option<Slot> {
        let want = round_up(len);
        for (index, region) in self.regions.iter_mut().enumerate() {
            let Some(region) = region else { continue };
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
                    expires: None,
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

    /// Starts the lease of slot `id` at `generation`: from `expires` on the
    /// reaper may take it. False if the slot is no longer at that generation.
    pub fn start_lease(&mut self, id: u64, generation: u64, expires: Instant) -> bool {
        match self.live.get_mut(&id) {
            Some(slot) if slot.generation == generation => {
                slot.expires = Some(expires);
                true
            }
            _ => false,
        }
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
        let free = &mut self.regions[slot.region]
            .as_mut()
            .expect("a region holding a live slot is never removed")
            .free;
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
        let a = p.allocate(100).unwrap();
        let b = p.allocate(200).unwrap();
        let c = p.allocate(300).unwrap();
        assert!(p.allocate(600).is_none());
        assert!(p.release(b.id, b.generation));
        assert!(!p.release(b.id, b.generation), "double release is refused");
        assert!(p.release(a.id, a.generation));
        assert!(p.release(c.id, c.generation));
        assert_eq!(p.bytes_in_use(), 0);
        assert!(
            p.allocate(1024).is_some(),
            "free space coalesced back to one range"
        );
    }

    #[test]
    fn stale_generation_cannot_free_new_occupant() {
        let mut p = Pool::new();
        p.add_region(128);
        let now = Instant::now();
        let old = p.allocate(64).unwrap();
        assert!(p.start_lease(old.id, old.generation, now));
        assert_eq!(p.reclaim_expired(now + Duration::from_millis(1)).len(), 1);
        let new = p.allocate(64).unwrap();
        assert_eq!((new.region, new.offset), (old.region, old.offset));
        assert_ne!(new.generation, old.generation);
        assert!(!p.release(old.id, old.generation));
        assert_eq!(p.slots_in_use(), 1);
    }

    #[test]
    fn grows_across_regions() {
        let mut p = Pool::new();
        p.add_region(64);
        assert!(p.allocate(100).is_none());
        p.add_region(256);
        let s = p.allocate(100).unwrap();
        assert_eq!(s.region, 1);
    }

    #[test]
    fn unpublished_slots_have_no_lease() {
        let mut p = Pool::new();
        p.add_region(128);
        let slot = p.allocate(64).unwrap();
        let later = Instant::now() + Duration::from_secs(3600);
        assert!(
            p.reclaim_expired(later).is_empty(),
            "a slot still being written is never reclaimed"
        );
        assert!(p.start_lease(slot.id, slot.generation, Instant::now()));
        assert_eq!(p.reclaim_expired(later).len(), 1);
        assert!(!p.start_lease(slot.id, slot.generation, later), "gone");
    }

    #[test]
    fn empty_regions_can_be_removed_and_their_index_reused() {
        let mut p = Pool::new();
        p.add_region(64);
        p.add_region(64);
        let held = p.allocate(64).unwrap();
        assert_eq!(p.empty_regions(), vec![(1, 64)]);
        assert!(!p.remove_region(held.region), "a region with a slot stays");
        assert!(p.remove_region(1));
        assert_eq!((p.region_count(), p.region_bytes()), (1, 64));
        assert_eq!(p.add_region(256), 1, "the freed index is reused");
        assert!(p.allocate(200).is_some());
        assert!(p.release(held.id, held.generation));
        assert_eq!(p.empty_regions().len(), 1);
    }
}
