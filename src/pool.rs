//! Slot allocation inside a few large registered regions.
//!
//! Regions are registered once and never shrink while in use; images get
//! sub-ranges ("slots"). A region that holds no slot can be removed, so a
//! pool that grew for mid-size images can make room for a larger one. Every
//! allocation carries a fresh generation, so a stale release or a late reader
//! naming an old generation cannot touch the slot's next occupant. A slot has
//! no lease until it is published ([`Pool::start_lease`]): the reaper never
//! takes a slot its writer still fills.
//!
//! A published slot is held by its hand-outs (each descriptor given out for
//! it, numbered, with its own lease end) and by a cache pin. Each hand-out
//! ends once, by its number: its reader's notification, its owner's release
//! or its lease's end. The slot is freed when nothing holds it: no hand-out
//! outstanding and no pin. Pinned slots are evicted oldest-used first, to
//! keep the pinned bytes within a budget or to make room for a new slot.
//! Pure bookkeeping: no NIXL here.

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
}

/// What holds a live slot besides its bytes.
#[derive(Debug)]
struct Live {
    slot: Slot,
    /// Outstanding hand-outs: (number, lease end).
    handouts: Vec<(u64, Instant)>,
    /// The number the next hand-out gets; 0 until published.
    next_handout: u64,
    /// The slot's place in the pinned order (the tick of its last use).
    pinned: Option<u64>,
}

impl Live {
    fn is_held(&self) -> bool {
        !self.handouts.is_empty() || self.pinned.is_some()
    }
}

#[derive(Debug, Default)]
struct RegionSpace {
    size: usize,
    /// Free ranges, offset -> length, coalesced.
    free: BTreeMap<usize, usize>,
}

/// What ending a hand-out (or a pin) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Nothing: no such slot at that generation, or no such hand-out (a
    /// stale or repeated end, which must not touch anyone else's).
    Stale,
    /// Ended; the slot is still held by other hand-outs or a pin.
    Held,
    /// Ended, and that freed the slot (returned, for its header to be cleared).
    Freed(Slot),
}

#[derive(Debug, Default)]
pub struct Pool {
    /// Indexed by `Slot::region`; a removed region leaves `None`, reused by
    /// the next region added.
    regions: Vec<Option<RegionSpace>>,
    live: HashMap<u64, Live>,
    next_generation: u64,
    bytes_in_use: usize,
    /// Pinned slots, least recently used first: tick -> slot id.
    pins: BTreeMap<u64, u64>,
    next_tick: u64,
    pinned_bytes: usize,
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
                };
                self.live.insert(
                    slot.id,
                    Live {
                        slot,
                        handouts: Vec::new(),
                        next_handout: 0,
                        pinned: None,
                    },
                );
                self.bytes_in_use += want;
                return Some(slot);
            }
        }
        None
    }

    pub fn get(&self, id: u64) -> Option<Slot> {
        self.live.get(&id).map(|live| live.slot)
    }

    fn live_at(&mut self, id: u64, generation: u64) -> Option<&mut Live> {
        self.live
            .get_mut(&id)
            .filter(|live| live.slot.generation == generation)
    }

    /// Publishes slot `id` at `generation`: its first hand-out (number 0)
    /// starts, and from `expires` on the reaper may end it. False if the
    /// slot is no longer at that generation or was published already.
    pub fn start_lease(&mut self, id: u64, generation: u64, expires: Instant) -> bool {
        match self.live_at(id, generation) {
            Some(live) if live.next_handout == 0 => {
                live.handouts.push((0, expires));
                live.next_handout = 1;
                true
            }
            _ => false,
        }
    }

    /// One more hand-out of a pinned slot, its lease ending at `expires`:
    /// its number, or `None` when the slot is not pinned at `generation`
    /// (evicted, freed, reused). Counts as a use for the eviction order.
    pub fn hand_out(&mut self, id: u64, generation: u64, expires: Instant) -> Option<u64> {
        let tick = self.next_tick;
        let live = self.live_at(id, generation)?;
        let old = live.pinned?;
        live.pinned = Some(tick);
        let number = live.next_handout;
        live.next_handout += 1;
        live.handouts.push((number, expires));
        self.pins.remove(&old);
        self.pins.insert(tick, id);
        self.next_tick += 1;
        Some(number)
    }

    /// Gives back a slot never published, or ends hand-out 0 of a published
    /// one; false when that ended nothing (a stale or repeated release).
    pub fn release(&mut self, id: u64, generation: u64) -> bool {
        self.end_handout(id, generation, 0) != Ended::Stale
    }

    /// Ends hand-out `handout` of slot `id` at `generation`; the slot is
    /// freed when nothing holds it any more. A slot never published (its
    /// writer gives it back) is freed by hand-out 0.
    pub fn end_handout(&mut self, id: u64, generation: u64, handout: u64) -> Ended {
        let Some(live) = self.live_at(id, generation) else {
            return Ended::Stale;
        };
        if live.next_handout == 0 {
            if handout != 0 {
                return Ended::Stale;
            }
        } else {
            let Some(at) = live.handouts.iter().position(|&(n, _)| n == handout) else {
                return Ended::Stale;
            };
            live.handouts.swap_remove(at);
            if live.is_held() {
                return Ended::Held;
            }
        }
        Ended::Freed(self.free(id))
    }

    /// Pins published slot `id` at `generation` (a cache keeps it), then
    /// unpins the least recently used others until the pinned bytes are
    /// within `budget`. False, and nothing changes, when the slot is not
    /// live and published at that generation, is pinned already, or alone
    /// exceeds the budget. `evicted` gets every slot unpinned, and whether
    /// that freed it.
    pub fn pin(
        &mut self,
        id: u64,
        generation: u64,
        budget: usize,
        evicted: &mut Vec<(Slot, bool)>,
    ) -> bool {
        let tick = self.next_tick;
        let Some(live) = self.live_at(id, generation) else {
            return false;
        };
        let bytes = round_up(live.slot.len);
        if live.next_handout == 0 || live.pinned.is_some() || bytes > budget {
            return false;
        }
        live.pinned = Some(tick);
        self.pins.insert(tick, id);
        self.next_tick += 1;
        self.pinned_bytes += bytes;
        while self.pinned_bytes > budget {
            match self.evict_oldest() {
                Some(gone) => evicted.push(gone),
                None => break,
            }
        }
        true
    }

    /// Unpins slot `id` at `generation`, freeing it when no hand-out is
    /// outstanding.
    pub fn unpin(&mut self, id: u64, generation: u64) -> Ended {
        let Some(live) = self.live_at(id, generation) else {
            return Ended::Stale;
        };
        let Some(tick) = live.pinned.take() else {
            return Ended::Stale;
        };
        let held = live.is_held();
        let bytes = round_up(live.slot.len);
        self.pins.remove(&tick);
        self.pinned_bytes -= bytes;
        if held {
            Ended::Held
        } else {
            Ended::Freed(self.free(id))
        }
    }

    /// Unpins the least recently used pinned slot: it, and whether that
    /// freed it (it is freed later, by its last hand-out's end, otherwise).
    pub fn evict_oldest(&mut self) -> Option<(Slot, bool)> {
        let (_, &id) = self.pins.iter().next()?;
        let slot = self.live[&id].slot;
        match self.unpin(id, slot.generation) {
            Ended::Freed(slot) => Some((slot, true)),
            Ended::Held => Some((slot, false)),
            Ended::Stale => unreachable!("a slot in the pinned order is pinned"),
        }
    }

    pub fn pinned_bytes(&self) -> usize {
        self.pinned_bytes
    }

    pub fn pinned_slots(&self) -> usize {
        self.pins.len()
    }

    /// Hand-outs not yet ended, over every slot.
    pub fn outstanding_handouts(&self) -> usize {
        self.live.values().map(|live| live.handouts.len()).sum()
    }

    /// Ends every hand-out whose lease ended before `now`; returns the
    /// slots that freed.
    pub fn reclaim_expired(&mut self, now: Instant) -> Vec<Slot> {
        let mut freed = Vec::new();
        for live in self.live.values_mut() {
            let before = live.handouts.len();
            live.handouts.retain(|&(_, end)| end > now);
            if live.handouts.len() < before && !live.is_held() {
                freed.push(live.slot.id);
            }
        }
        freed.into_iter().map(|id| self.free(id)).collect()
    }

    fn free(&mut self, id: u64) -> Slot {
        let live = self.live.remove(&id).expect("present");
        debug_assert!(live.pinned.is_none());
        self.give_back(live.slot);
        live.slot
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

    fn published(p: &mut Pool, len: usize, expires: Instant) -> Slot {
        let slot = p.allocate(len).unwrap();
        assert!(p.start_lease(slot.id, slot.generation, expires));
        slot
    }

    #[test]
    fn each_handout_ends_once_and_the_slot_is_freed_once_nothing_holds_it() {
        let mut p = Pool::new();
        p.add_region(4096);
        let later = Instant::now() + Duration::from_secs(3600);
        let s = published(&mut p, 64, later);
        assert_eq!(
            p.hand_out(s.id, s.generation, later),
            None,
            "only a pinned slot is handed out again"
        );
        let mut evicted = Vec::new();
        assert!(p.pin(s.id, s.generation, 4096, &mut evicted));
        assert!(
            !p.pin(s.id, s.generation, 4096, &mut evicted),
            "pinned once"
        );
        assert_eq!(p.hand_out(s.id, s.generation, later), Some(1));
        assert_eq!(p.hand_out(s.id, s.generation, later), Some(2));
        assert_eq!(p.end_handout(s.id, s.generation, 1), Ended::Held);
        assert_eq!(
            p.end_handout(s.id, s.generation, 1),
            Ended::Stale,
            "a repeated end (a second notification) ends nothing"
        );
        assert_eq!(p.end_handout(s.id, s.generation, 7), Ended::Stale);
        assert_eq!(p.end_handout(s.id, s.generation, 0), Ended::Held);
        assert_eq!(p.end_handout(s.id, s.generation, 2), Ended::Held, "pinned");
        assert_eq!(p.slots_in_use(), 1);
        assert!(matches!(p.unpin(s.id, s.generation), Ended::Freed(f) if f == s));
        assert_eq!(p.unpin(s.id, s.generation), Ended::Stale);
        assert_eq!(
            (p.slots_in_use(), p.bytes_in_use(), p.pinned_bytes()),
            (0, 0, 0)
        );
        assert!(evicted.is_empty());
    }

    #[test]
    fn an_evicted_slot_lives_until_its_last_handout_ends() {
        let mut p = Pool::new();
        p.add_region(4096);
        let now = Instant::now();
        let s = published(&mut p, 64, now + Duration::from_secs(10));
        let mut evicted = Vec::new();
        assert!(p.pin(s.id, s.generation, 4096, &mut evicted));
        assert_eq!(
            p.hand_out(s.id, s.generation, now + Duration::from_secs(20)),
            Some(1)
        );
        assert_eq!(p.evict_oldest(), Some((s, false)), "still read: not freed");
        assert_eq!(
            p.hand_out(s.id, s.generation, now),
            None,
            "no hand-out once evicted"
        );
        assert!(p.reclaim_expired(now + Duration::from_secs(15)).is_empty());
        assert_eq!(p.reclaim_expired(now + Duration::from_secs(25)), vec![s]);
        assert_eq!(p.end_handout(s.id, s.generation, 1), Ended::Stale);
        assert_eq!(p.slots_in_use(), 0);
    }

    #[test]
    fn a_pinned_idle_slot_outlives_its_leases_and_pins_stay_within_the_budget() {
        let mut p = Pool::new();
        p.add_region(4096);
        let now = Instant::now();
        let a = published(&mut p, 64, now);
        let b = published(&mut p, 64, now);
        let c = published(&mut p, 64, now);
        let mut evicted = Vec::new();
        assert!(p.pin(a.id, a.generation, 128, &mut evicted));
        assert!(p.pin(b.id, b.generation, 128, &mut evicted));
        assert!(
            p.reclaim_expired(now + Duration::from_secs(1)).len() == 1,
            "c only"
        );
        assert_eq!(p.slots_in_use(), 2, "pinned slots stay without a lease");
        // A use moves `a` to the back of the order: pinning `c` evicts `b`.
        assert_eq!(
            p.hand_out(a.id, a.generation, now + Duration::from_secs(9)),
            Some(1)
        );
        let c2 = published(&mut p, 64, now + Duration::from_secs(9));
        assert!(p.pin(c2.id, c2.generation, 128, &mut evicted));
        assert_eq!(evicted, vec![(b, true)]);
        assert_eq!(p.pinned_bytes(), 128);
        assert!(!p.pin(c.id, c.generation, 128, &mut evicted), "c was freed");
        let big = published(&mut p, 256, now);
        assert!(
            !p.pin(big.id, big.generation, 128, &mut evicted),
            "over the budget alone"
        );
        assert_eq!(evicted.len(), 1);
    }
}
