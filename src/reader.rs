//! Worker side: pull published pixels with a NIXL READ into registered
//! memory, check them, and hand them out.
//!
//! The frontends read from are loaded and reloaded by `remotes.rs`. Each
//! READ of a pixelwire descriptor is followed by a READ of the slot header:
//! if the frontend freed or reused the slot meanwhile, the header says so
//! and the pixels are refused (a seqlock over NIXL).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_sys::MemType;

use crate::agent::{
    Agent, AgentOptions, PostedRead, ReadError, READER_PROGRESS_THREAD_TIMEOUT_US, SETTLE_ON_DROP,
};
use crate::background::{Background, Ticket};
use crate::errors::{Error, Result};
use crate::foreign::{self, ForeignMemory};
use crate::pool::Slot;
use crate::quarantine::Quarantine;
use crate::region::{ForeignRegion, HostRegion, RegisteredPool, SlotPool};
use crate::remotes::Remotes;
pub use crate::wire::Source;
use crate::wire::{self, SLOT_HEADER_BYTES};

/// Background threads for [`Reader::read_soon`]: one per read in flight
/// (a READ from a stuck frontend holds its thread until the timeout), so
/// this bounds concurrent reads that way, not the pool.
const MAX_READ_THREADS: usize = 64;

#[derive(Clone, Copy, Debug)]
pub struct ReaderConfig {
    pub pool_bytes: usize,
    pub region_bytes: usize,
    pub timeout: Duration,
    /// A frontend no read has used for this long is forgotten.
    pub frontend_idle: Duration,
    pub verify: bool,
    /// NIXL's progress thread on the reader's agent (the reader polls its
    /// own READs; the thread only contends for the worker's lock).
    pub progress_thread: bool,
    /// UCX backend threads a large READ is split across (0: one thread).
    pub read_threads: usize,
    /// READs of at least this many bytes are split across `read_threads`.
    pub split_min_bytes: usize,
    /// Host READs with a content hash to check go in chunks of this size
    /// (rounded up to whole hash pieces), all in flight at once when the
    /// descriptor has a slot header; each chunk's pieces are hashed as it
    /// lands, while the rest are READ.
    pub chunk_bytes: usize,
    /// Threads that hash the pieces of verified reads.
    pub hash_threads: usize,
}

/// Pixels a read produced: a leased receive slot or an owned copy.
pub enum Pixels {
    Leased(Lease),
    Owned(Vec<u8>),
}

/// A receive slot holding one image's pixels; the slot returns to the pool
/// when the lease drops.
pub struct Lease {
    reader: Arc<Reader>,
    slot: Slot,
    region: Arc<HostRegion>,
    at: usize,
    len: usize,
}

impl Lease {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot is owned by this lease until it drops.
        unsafe { self.region.slice(self.at, self.len) }
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        // SAFETY: as above; the caller exposes it as this lease's buffer.
        unsafe { self.region.slice_mut(self.at, self.len) }.as_mut_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.reader.release(self.slot);
    }
}

/// The error of pixels whose content hash is not the descriptor's.
fn hash_mismatch() -> Error {
    Error::Transfer(
        "the pixels read do not match the descriptor's content hash: the descriptor is wrong or the slot was overwritten".into(),
    )
}

/// `error`, marked as one after which bytes may still land if other READs
/// into the same destination were in flight when it happened.
fn landing_if(error: ReadError, others_in_flight: bool) -> ReadError {
    ReadError {
        may_land: error.may_land || others_in_flight,
        ..error
    }
}

pub struct Reader {
    slots: SlotPool,
    /// Slots whose READ failed after it was posted: the transfer may still
    /// land in them.
    quarantine: Quarantine<Slot>,
    remotes: Remotes,
    foreign: ForeignMemory,
    config: ReaderConfig,
    background: Background,
    hashers: rayon::ThreadPool,
    agent: Agent,
}

impl Drop for Reader {
    fn drop(&mut self) {
        // The fields go before the agent: first let READs given up on end,
        // and if one will not, keep the memory it may still write.
        if !self.agent.settle(None, Instant::now() + SETTLE_ON_DROP) {
            std::mem::forget(std::mem::replace(&mut self.slots, SlotPool::new(0, 1)));
            std::mem::forget(std::mem::replace(
                &mut self.foreign,
                ForeignMemory::new(self.config.timeout),
            ));
        }
    }
}

impl Reader {
    pub fn new(config: ReaderConfig) -> Result<Reader> {
        Ok(Reader {
            slots: SlotPool::new(config.pool_bytes, config.region_bytes),
            quarantine: Quarantine::new(config.timeout),
            remotes: Remotes::new(config.frontend_idle),
            foreign: ForeignMemory::new(config.timeout),
            config,
            background: Background::new("pixelwire-read", MAX_READ_THREADS),
            hashers: rayon::ThreadPoolBuilder::new()
                .num_threads(config.hash_threads.max(1))
                .thread_name(|i| format!("pixelwire-hash-{i}"))
                .build()
                .map_err(|e| Error::Transfer(format!("cannot start the hashing threads: {e}")))?,
            agent: Agent::new(
                "worker",
                &AgentOptions {
                    progress_thread: config.progress_thread,
                    progress_timeout_us: READER_PROGRESS_THREAD_TIMEOUT_US,
                    threads: config.read_threads,
                },
            )?,
        })
    }

    pub fn agent_name(&self) -> &str {
        self.agent.name()
    }

    /// How long one read may take before it fails.
    pub fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// Caller memory (CUDA staging) registered right now, quarantined or not.
    pub fn foreign_count(&self) -> usize {
        self.foreign.count()
    }

    /// What failed READs may still write: (receive slots, registrations of
    /// caller memory).
    pub fn quarantined(&self) -> (usize, usize) {
        self.end_quarantines(&mut self.slots.lock());
        (self.quarantine.len(), self.foreign.quarantined_count())
    }

    /// READs given up on (timed out, or left by a failed read) that UCX may
    /// still be serving.
    pub fn abandoned_reads(&self) -> usize {
        self.agent.abandoned_count()
    }

    /// Loads of frontends' metadata: (connects, merges without reconnecting).
    pub fn remote_load_counts(&self) -> (u64, u64) {
        self.remotes.load_counts()
    }

    /// Frontends whose metadata is loaded right now, once those idle past
    /// the limit are forgotten.
    pub fn remote_count(&self) -> usize {
        self.remotes.forget_idle(&self.agent);
        self.remotes.loaded_count()
    }

    /// (bytes held by receive slots, including quarantined ones; bytes registered).
    pub fn usage(&self) -> (usize, usize) {
        let mut state = self.slots.lock();
        self.end_quarantines(&mut state);
        (state.pool.bytes_in_use(), state.pool.region_bytes())
    }

    /// Descriptors a READ of `len` bytes is split into.
    fn pieces(&self, len: usize) -> usize {
        if self.config.read_threads > 0 && len >= self.config.split_min_bytes {
            // The backend gives each thread two descriptors.
            2 * self.config.read_threads
        } else {
            1
        }
    }

    /// READs the source's pixels into `pixels_to`, in chunks of at most
    /// `chunk` bytes, calling `on_chunk(offset, len)` in order as each lands
    /// (the caller starts hashing it, or copying it on to a GPU); then
    /// (pixelwire descriptors) its slot header into host memory at
    /// `header_to`, and checks it. With a slot header the chunks are posted
    /// without waiting for one another (from the second on, the chunks
    /// found landed are handed to `on_chunk` before the next is posted) and
    /// the notification rides on the header's READ, posted once every chunk
    /// has landed; without one the chunks go one after the other and the
    /// last carries it. Either way the frontend frees the slot only after
    /// every READ. Chunks handed to `on_chunk` are not yet checked: only an
    /// `Ok` from here says the pixels are the published ones.
    fn transfer_chunked(
        &self,
        source: &Source,
        pixels_to: (usize, MemType, u64),
        header_to: usize,
        chunk: usize,
        on_chunk: &mut dyn FnMut(usize, usize) -> Result<()>,
    ) -> std::result::Result<(), ReadError> {
        let refused = |error: Error| ReadError {
            error,
            may_land: false,
        };
        let deadline = Instant::now() + self.config.timeout;
        let (name, remote) = self
            .remotes
            .connect(&self.agent, source, deadline)
            .map_err(refused)?;
        let _shared = remote.reading();
        let notification = source.notification.as_bytes();
        let (to, mem, dev) = pixels_to;
        let chunk = chunk.max(1);
        let in_flight_max = if source.header.is_some() {
            usize::MAX
        } else {
            1
        };
        let mut pixels = || -> std::result::Result<(), ReadError> {
            let mut in_flight: VecDeque<(usize, usize, PostedRead)> = VecDeque::new();
            let mut next = 0;
            // The front chunk once it has landed (waited for when `wait`),
            // handed to `on_chunk`; Ok(false) when it has not landed yet.
            let mut land = |in_flight: &mut VecDeque<(usize, usize, PostedRead)>,
                            wait: bool|
             -> std::result::Result<bool, ReadError> {
                let Some((_, _, posted)) = in_flight.front_mut() else {
                    return Ok(false);
                };
                let landed = if wait {
                    self.agent.wait_read(posted, deadline).map(|()| true)
                } else {
                    self.agent.poll_read(posted)
                };
                let landed = match landed {
                    Ok(false) => return Ok(false),
                    Ok(true) => {
                        let (at, n, _) = in_flight.pop_front().expect("looked at above");
                        on_chunk(at, n).map_err(refused)
                    }
                    Err(error) => {
                        // Its request is let go (as abandoned) with it.
                        in_flight.pop_front();
                        Err(error)
                    }
                };
                if let Err(error) = landed {
                    // The READs still running are waited for (until the
                    // deadline) before their requests are let go: NIXL is
                    // not asked to drop a request UCX may still be serving.
                    // Bytes may have landed meanwhile, so the destination
                    // is still treated as written by them.
                    let others = !in_flight.is_empty();
                    for (_, _, mut running) in in_flight.drain(..) {
                        let _ = self.agent.wait_read(&mut running, deadline);
                    }
                    return Err(landing_if(error, others));
                }
                Ok(true)
            };
            loop {
                if next < source.len && in_flight.len() < in_flight_max {
                    let n = chunk.min(source.len - next);
                    let last = next + n >= source.len;
                    let note = (last && source.header.is_none()).then_some(notification);
                    let posted = self
                        .agent
                        .post_read(
                            &name,
                            (to + next, mem, dev),
                            (source.addr + next, n),
                            self.pieces(n),
                            note,
                        )
                        .map_err(|e| landing_if(e, !in_flight.is_empty()))?;
                    in_flight.push_back((next, n, posted));
                    next += n;
                    // Chunks that have landed are handed on before the next
                    // is posted. NIXL's threaded UCX engine returns from a
                    // post of a split READ once its threads have issued it,
                    // which on one host (CMA) is mostly once its bytes have
                    // been copied: posting every chunk first left the
                    // hashing and the device copies nothing to overlap. The
                    // first hand-off waits for a second chunk to be posted:
                    // its callback may wait for the caller (a CUDA read's
                    // device memory is given while the first chunk lands).
                    if next >= chunk.saturating_mul(2) || next >= source.len {
                        while land(&mut in_flight, false)? {}
                    }
                    continue;
                }
                if !land(&mut in_flight, true)? {
                    return Ok(());
                }
            }
        };
        let outcome = match &source.header {
            None => pixels(),
            Some(header) => {
                let header_at = source.addr.checked_sub(SLOT_HEADER_BYTES).ok_or_else(|| {
                    refused(Error::Descriptor(
                        "descriptor address has no room for its slot header".into(),
                    ))
                })?;
                pixels()
                    .and_then(|()| {
                        self.agent.read(
                            &name,
                            (header_to, MemType::Dram, 0),
                            (header_at, SLOT_HEADER_BYTES),
                            1,
                            Some(notification),
                            deadline,
                        )
                    })
                    .and_then(|()| {
                        // SAFETY: `header_to` is the caller's receive slot, now complete.
                        let got = unsafe {
                            std::slice::from_raw_parts(header_to as *const u8, SLOT_HEADER_BYTES)
                        };
                        if header.is_in(got) {
                            Ok(())
                        } else {
                            Err(refused(Error::Transfer(format!(
                                "the frontend {name} reclaimed or reused slot {} before its READ finished (its lease ended, or the descriptor is stale): no pixels",
                                header.slot
                            ))))
                        }
                    })
            }
        };
        if let Err(e) = &outcome {
            if e.may_land {
                // The connection may be broken: the next read reloads it,
                // once the reads in flight are done.
                remote.mark_broken();
            }
        }
        outcome
    }

    /// READs the source into host memory. The pixels stay in the receive
    /// slot (zero-copy, freed when the returned lease drops) while at most
    /// half the pool is held that way; past that they are copied out so
    /// callers that keep images cannot starve the pool.
    pub fn read(self: &Arc<Self>, source: &Source) -> Result<Pixels> {
        let header_bytes = if source.header.is_some() {
            SLOT_HEADER_BYTES
        } else {
            0
        };
        let (slot, region) = self.acquire(source.len + header_bytes)?;
        let base = region.addr() + slot.offset;
        let pixels_at = base + header_bytes;
        let expected = source.content_hash.as_ref().filter(|_| self.config.verify);
        let outcome = match expected {
            Some(_) => self
                .transfer_hashing(
                    source,
                    pixels_at,
                    base,
                    self.config.chunk_bytes,
                    &mut |_, _| Ok(()),
                )
                .map(Some),
            None => self
                .transfer_chunked(
                    source,
                    (pixels_at, MemType::Dram, 0),
                    base,
                    source.len.max(1),
                    &mut |_, _| Ok(()),
                )
                .map(|()| None),
        };
        let digest = match outcome {
            Ok(digest) => digest,
            Err(e) => {
                self.give_back(slot, e.may_land);
                return Err(e.error);
            }
        };
        let lease = Lease {
            reader: Arc::clone(self),
            slot,
            region,
            at: slot.offset + header_bytes,
            len: source.len,
        };
        if let (Some(expected), Some(got)) = (expected, digest) {
            if &got != expected {
                return Err(hash_mismatch());
            }
        }
        let held = self.slots.lock().pool.bytes_in_use();
        if held <= self.config.pool_bytes / 2 {
            Ok(Pixels::Leased(lease))
        } else {
            Ok(Pixels::Owned(lease.as_slice().to_vec()))
        }
    }

    /// [`Reader::read`] on one of the reader's background threads, started
    /// now: the caller may wait for the ticket a few microseconds in place
    /// (a small READ finishes in that time) before it waits elsewhere. A
    /// ticket dropped untaken still ends its read, and its pixels go back
    /// to the pool.
    /// `then()` runs once the ticket is complete.
    pub fn read_soon(
        self: &Arc<Self>,
        source: Source,
        then: impl FnOnce() + Send + 'static,
    ) -> Ticket<Result<Pixels>> {
        self.soon(move |reader| reader.read(&source), then)
    }

    /// `work(reader)` on one of the reader's background threads, started
    /// now; `then()` runs once the ticket is complete.
    pub fn soon<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Arc<Reader>) -> T + Send + 'static,
        then: impl FnOnce() + Send + 'static,
    ) -> Ticket<T> {
        let reader = Arc::clone(self);
        self.background.submit_then(move || work(&reader), then)
    }

    /// [`Reader::transfer_chunked`] into host memory at `pixels_at`, in
    /// chunks of whole hash pieces, each chunk's pieces hashed on the
    /// hashing threads as it lands: returns the content hash of all the
    /// pixels (meaningful only once the slot header has been checked, which
    /// an `Ok` says it has).
    fn transfer_hashing(
        &self,
        source: &Source,
        pixels_at: usize,
        header_to: usize,
        chunk: usize,
        on_chunk: &mut dyn FnMut(usize, usize) -> Result<()>,
    ) -> std::result::Result<String, ReadError> {
        let piece = wire::HASH_PIECE_BYTES;
        // Whole pieces (no piece spans two chunks), and no overflow for a
        // chunk setting of "everything at once".
        let chunk = chunk.clamp(1, source.len.max(1)).div_ceil(piece) * piece;
        let digests: Vec<AtomicU64> = (0..source.len.div_ceil(piece))
            .map(|_| AtomicU64::new(0))
            .collect();
        let digests = &digests;
        let outcome = self.hashers.in_place_scope(|scope| {
            self.transfer_chunked(
                source,
                (pixels_at, MemType::Dram, 0),
                header_to,
                chunk,
                &mut |at, len| {
                    debug_assert_eq!(at % piece, 0);
                    on_chunk(at, len)?;
                    let hash = move |start: usize| {
                        let n = piece.min(at + len - start);
                        // SAFETY: this piece of the caller's receive slot
                        // has been READ; nothing writes it while the read
                        // holds the slot (other chunks land in other
                        // bytes), and the scope ends before the slot can
                        // be released.
                        let bytes = unsafe {
                            std::slice::from_raw_parts((pixels_at + start) as *const u8, n)
                        };
                        digests[start / piece].store(wire::piece_digest(bytes), Ordering::Relaxed);
                    };
                    let last_piece = (at + len - 1) / piece * piece;
                    for start in (at..last_piece).step_by(piece) {
                        scope.spawn(move |_| hash(start));
                    }
                    // The chunk's last piece here: the image's last one
                    // would be waited for anyway, and a one-piece image
                    // then never waits for a hashing thread to wake.
                    hash(last_piece);
                    Ok(())
                },
            )
        });
        // The scope has joined every hashing task.
        outcome.map(|()| {
            let digests: Vec<u64> = digests.iter().map(|d| d.load(Ordering::Relaxed)).collect();
            wire::combine_piece_digests(&digests)
        })
    }

    /// Registers caller-owned memory (a CUDA buffer) until
    /// [`Reader::deregister_foreign`], keeping `owner` as long; returns its
    /// registration id.
    ///
    /// # Safety
    /// `addr..addr+len` must stay allocated while it is registered: `owner`
    /// keeps it so, or else the caller does for the life of the reader.
    pub unsafe fn register_foreign(
        &self,
        region: ForeignRegion,
        owner: Option<foreign::Owner>,
    ) -> Result<u64> {
        self.foreign.register(&self.agent, region, owner)
    }

    /// Gives caller memory up: deregistered now, or, while a failed READ
    /// may still write it, once its quarantine ends (its owner is kept
    /// until then). False for an unknown id.
    pub fn deregister_foreign(&self, id: u64) -> bool {
        self.foreign.deregister(id)
    }

    /// Whether a failed READ may still write registered caller memory `id`:
    /// until it may not, no read goes into it.
    pub fn foreign_quarantined(&self, id: u64) -> bool {
        self.foreign.is_quarantined(id)
    }

    /// READs the source straight into registered caller memory, in chunks
    /// of at most `chunk` bytes, calling `on_chunk(offset, len)` as each
    /// lands (see [`Reader::transfer_chunked`]: nothing is checked until
    /// this returns `Ok`). Into host memory, with a content hash to check
    /// and `verify` on, the chunks are whole hash pieces, hashed as they
    /// land like [`Reader::read`]'s, and the hash is checked before `Ok`.
    /// On error the destination holds indeterminate bytes; `may_land` says
    /// whether a transfer may still write it: registered caller memory is
    /// then quarantined (no read goes into it until the transfer has surely
    /// ended), and so is any read into it until then refused.
    pub fn read_into(
        &self,
        source: &Source,
        local: (usize, MemType, u64),
        chunk: usize,
        on_chunk: &mut dyn FnMut(usize, usize) -> Result<()>,
    ) -> std::result::Result<(), ReadError> {
        let refused = |error: Error| ReadError {
            error,
            may_land: false,
        };
        let destination = self.foreign.holding(local.0, source.len);
        if let Some(id) = destination.filter(|&id| self.foreign.is_quarantined(id)) {
            return Err(refused(Error::Transfer(format!(
                "registered memory {id} is quarantined: a failed READ may still write it (deregister it and read into other memory)"
            ))));
        }
        let (slot, region) = self.acquire(SLOT_HEADER_BYTES).map_err(refused)?;
        let header_to = region.addr() + slot.offset;
        let expected = source.content_hash.as_ref().filter(|_| self.config.verify);
        let outcome = match (expected, local.1) {
            (Some(expected), MemType::Dram) => self
                .transfer_hashing(source, local.0, header_to, chunk, on_chunk)
                .and_then(|got| {
                    if &got == expected {
                        Ok(())
                    } else {
                        Err(refused(hash_mismatch()))
                    }
                }),
            _ => self.transfer_chunked(source, local, header_to, chunk, on_chunk),
        };
        let may_land = outcome.as_ref().is_err_and(|e| e.may_land);
        self.give_back(slot, may_land);
        if let Some(id) = destination.filter(|_| may_land) {
            self.foreign.quarantine(id);
        }
        outcome
    }

    fn acquire(&self, len: usize) -> Result<(Slot, Arc<HostRegion>)> {
        let cap = self.config.pool_bytes;
        if len > cap {
            return Err(Error::Descriptor(format!(
                "image of {len} bytes is larger than the reader's pool ({cap} bytes)"
            )));
        }
        let deadline = Instant::now() + self.config.timeout;
        let allocation = self.slots.acquire(&self.agent, len, deadline, |state| {
            self.end_quarantines(state)
        })?;
        match allocation {
            Some(a) => Ok((a.slot, a.region)),
            None => Err(Error::PoolExhausted(format!(
                "no {len}-byte receive buffer became free within {:?}",
                self.config.timeout
            ))),
        }
    }

    fn release(&self, slot: Slot) {
        self.slots.lock().pool.release(slot.id, slot.generation);
        self.slots.notify_freed();
    }

    /// After a failed read: free the slot now, or (when the transfer may
    /// still land in it) once its quarantine ends.
    fn give_back(&self, slot: Slot, may_land: bool) {
        if may_land {
            self.quarantine.hold(slot);
        } else {
            self.release(slot);
        }
    }

    /// Frees the quarantined slots whose quarantine has ended (the caller
    /// holds the pool's lock).
    fn end_quarantines(&self, state: &mut RegisteredPool) {
        self.quarantine.end_due(Instant::now(), |slot| {
            state.pool.release(slot.id, slot.generation);
        });
    }
}
