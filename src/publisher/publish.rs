//! Publishing: a slot taken (waiting for one, making room by taking cache
//! pins off), filled by the caller (an image decoded straight into it, or a
//! video's frames), then published: content hash, slot header, lease. A
//! batch's images are published side by side on the fair pool, and its
//! owner can cancel it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{read_margin, unix_now, Metadata, Published, PublishedSlot, Publisher, Shared};
use crate::decode::{self, DecodeOptions, Mode, OutputShape};
use crate::errors::{Error, Result};
use crate::fair::FairPool;
use crate::patches::PatchGrid;
use crate::pool::Slot;
use crate::region::RegisteredPool;
use crate::wire::{self, SlotHeader, SLOT_HEADER_BYTES};

/// A single image of at most this many pixels is published on the caller's
/// thread (4 MP: a 1440p photo, about 15 ms to decode); a larger one waits
/// its turn on the publish pool, whose threads yield to the caller's.
const INLINE_PIXELS: u64 = 4_000_000;

/// How often a publish waiting for a slot looks whether its batch was cancelled.
const CANCEL_CHECK: Duration = Duration::from_millis(20);

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

impl Publisher {
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
}

fn check_packing(opts: &DecodeOptions, packing: Packing) -> Result<()> {
    match packing {
        Packing::Hwc => Ok(()),
        Packing::Rgbx if opts.mode == Mode::Rgb => Ok(()),
        Packing::Rgbx => Err(Error::InvalidArgument(
            "the RGBX layout needs mode RGB".to_string(),
        )),
        Packing::Patches(_) => crate::patches::check_mode(opts.mode),
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
