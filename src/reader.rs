//! Worker side: pull published pixels with a NIXL READ into registered
//! memory, check them, and hand back an owned copy.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nixl_sys::{MemType, RegistrationHandle};
use parking_lot::{Condvar, Mutex};

use crate::agent::{Agent, ForeignRegion, HostRegion, RegisteredPool};
use crate::errors::{Error, Result};
use crate::pool::Slot;
use crate::wire;

/// Agent metadata is a few hundred bytes; refuse anything absurd.
const MAX_METADATA: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
pub struct ReaderConfig {
    pub pool_bytes: usize,
    pub region_bytes: usize,
    pub timeout: Duration,
    pub verify: bool,
}

/// Where the pixels are and how to check them.
#[derive(Clone, Debug)]
pub struct Source {
    pub agent: String,
    pub metadata: String,
    pub addr: usize,
    pub len: usize,
    pub content_hash: Option<String>,
    pub notification: String,
}

struct State {
    slots: RegisteredPool,
    /// Slots whose READ failed: the transfer may still land in them, so they
    /// stay out of use until this instant.
    quarantine: Vec<(Slot, Instant)>,
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
}

impl Lease {
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot is owned by this lease until it drops.
        unsafe { self.region.slice(self.slot.offset, self.slot.len) }
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        // SAFETY: as above; the caller exposes it as this lease's buffer.
        unsafe { self.region.slice_mut(self.slot.offset, self.slot.len) }.as_mut_ptr()
    }

    pub fn len(&self) -> usize {
        self.slot.len
    }

    pub fn is_empty(&self) -> bool {
        self.slot.len == 0
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.reader.release(self.slot);
    }
}

pub struct Reader {
    state: Mutex<State>,
    freed: Condvar,
    /// Remote agent name -> the packed metadata it was loaded from.
    remotes: Mutex<HashMap<String, String>>,
    foreign: Mutex<Vec<RegistrationHandle>>,
    config: ReaderConfig,
    agent: Agent,
}

impl Reader {
    pub fn new(config: ReaderConfig) -> Result<Reader> {
        Ok(Reader {
            state: Mutex::new(State {
                slots: RegisteredPool::new(config.pool_bytes, config.region_bytes),
                quarantine: Vec::new(),
            }),
            freed: Condvar::new(),
            remotes: Mutex::new(HashMap::new()),
            foreign: Mutex::new(Vec::new()),
            config,
            agent: Agent::new("worker")?,
        })
    }

    pub fn agent_name(&self) -> &str {
        self.agent.name()
    }

    pub fn remote_count(&self) -> usize {
        self.remotes.lock().len()
    }

    /// (bytes held by receive slots, including quarantined ones; bytes registered).
    pub fn usage(&self) -> (usize, usize) {
        let state = self.state.lock();
        (
            state.slots.pool.bytes_in_use(),
            state.slots.pool.region_bytes(),
        )
    }

    /// Loads a frontend's metadata once, and again only when it changed;
    /// returns the agent to read from. An empty `source.agent` (dynamo's
    /// RdmaMetadata carries no name) takes the name the metadata holds.
    fn ensure_remote(&self, source: &Source) -> Result<String> {
        let mut remotes = self.remotes.lock();
        if source.agent.is_empty() {
            if let Some((name, _)) = remotes.iter().find(|(_, md)| **md == source.metadata) {
                return Ok(name.clone());
            }
        } else if remotes.get(&source.agent) == Some(&source.metadata) {
            return Ok(source.agent.clone());
        }
        let raw = wire::unpack_metadata(&source.metadata, MAX_METADATA)?;
        if remotes.remove(&source.agent).is_some() {
            self.agent.forget_remote(&source.agent);
        }
        let name = self.agent.load_remote(&raw)?;
        if !source.agent.is_empty() && name != source.agent {
            self.agent.forget_remote(&name);
            return Err(Error::Descriptor(format!(
                "descriptor names agent {:?} but its metadata belongs to {name:?}",
                source.agent
            )));
        }
        remotes.insert(name.clone(), source.metadata.clone());
        Ok(name)
    }

    /// Drops what is known about a frontend (after it failed).
    fn forget(&self, agent: &str) {
        if self.remotes.lock().remove(agent).is_some() {
            self.agent.forget_remote(agent);
        }
    }

    /// READs the source into host memory. The pixels stay in the receive
    /// slot (zero-copy, freed when the returned lease drops) while at most
    /// half the pool is held that way; past that they are copied out so
    /// callers that keep images cannot starve the pool.
    pub fn read(self: &Arc<Self>, source: &Source) -> Result<Pixels> {
        let (slot, region) = self.acquire(source.len)?;
        let local = (region.addr() + slot.offset, MemType::Dram, 0);
        let agent = match self.pull(source, local) {
            Ok(agent) => agent,
            Err(e) => {
                self.quarantine(slot);
                return Err(e);
            }
        };
        let lease = Lease {
            reader: Arc::clone(self),
            slot,
            region,
        };
        if self.config.verify {
            if let Some(expected) = &source.content_hash {
                let got = wire::content_hash(lease.as_slice());
                if &got != expected {
                    return Err(Error::Transfer(format!(
                        "pixels read from {agent} do not match their content hash ({got} != {expected}): the slot was reclaimed or the descriptor is wrong"
                    )));
                }
            }
        }
        let held = self.state.lock().slots.pool.bytes_in_use();
        if held <= self.config.pool_bytes / 2 {
            Ok(Pixels::Leased(lease))
        } else {
            Ok(Pixels::Owned(lease.as_slice().to_vec()))
        }
    }

    /// Registers caller-owned memory (a CUDA buffer) once; it stays
    /// registered for the reader's life.
    ///
    /// # Safety
    /// `addr..addr+len` must stay allocated until the reader is dropped.
    pub unsafe fn register_foreign(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
        device: u64,
    ) -> Result<()> {
        let handle = self.agent.register(&ForeignRegion {
            addr,
            len,
            mem_type,
            device,
        })?;
        self.foreign.lock().push(handle);
        Ok(())
    }

    /// READs the source straight into registered caller memory. On error
    /// the destination holds indeterminate bytes.
    pub fn read_into(&self, source: &Source, local: (usize, MemType, u64)) -> Result<()> {
        self.pull(source, local).map(drop)
    }

    /// The READ both paths share; returns the agent read from. After a
    /// failure the frontend's metadata is dropped, so a restarted or
    /// replaced frontend is loaded afresh.
    fn pull(&self, source: &Source, local: (usize, MemType, u64)) -> Result<String> {
        let agent = self.ensure_remote(source)?;
        let outcome = self.agent.read(
            &agent,
            local,
            source.addr,
            source.len,
            source.notification.as_bytes(),
            self.config.timeout,
        );
        match outcome {
            Ok(()) => Ok(agent),
            Err(e) => {
                self.forget(&agent);
                Err(e)
            }
        }
    }

    fn acquire(&self, len: usize) -> Result<(Slot, Arc<HostRegion>)> {
        let cap = self.config.pool_bytes;
        if len > cap {
            return Err(Error::Descriptor(format!(
                "image of {len} bytes is larger than the reader's pool ({cap} bytes)"
            )));
        }
        let deadline = Instant::now() + self.config.timeout;
        let mut state = self.state.lock();
        loop {
            let now = Instant::now();
            let (done, waiting): (Vec<_>, Vec<_>) = state
                .quarantine
                .drain(..)
                .partition(|(_, until)| *until <= now);
            state.quarantine = waiting;
            for (slot, _) in done {
                state.slots.pool.release(slot.id, slot.generation);
            }
            if let Some(a) = state.slots.allocate(&self.agent, len, None)? {
                return Ok((a.slot, a.region));
            }
            if self
                .freed
                .wait_until(&mut state, deadline.min(now + Duration::from_millis(100)))
                .timed_out()
                && Instant::now() >= deadline
            {
                return Err(Error::Transfer(format!(
                    "no {len}-byte receive buffer became free within {:?}",
                    self.config.timeout
                )));
            }
        }
    }

    fn release(&self, slot: Slot) {
        self.state
            .lock()
            .slots
            .pool
            .release(slot.id, slot.generation);
        self.freed.notify_all();
    }

    fn quarantine(&self, slot: Slot) {
        let until = Instant::now() + self.config.timeout * 2;
        self.state.lock().quarantine.push((slot, until));
    }
}
