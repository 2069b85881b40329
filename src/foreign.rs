//! Caller memory (a CUDA staging buffer) registered with a reader's agent
//! for READs straight into it. A registration a failed READ may still
//! write is quarantined (`quarantine.rs`): no READ goes into it, and a
//! deregistration asked for meanwhile happens once the quarantine ends.
//! The memory's owner (the caller's handle on it, such as a tensor) is kept
//! until the registration is gone, so the memory outlives every READ that
//! may write it.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nixl_sys::RegistrationHandle;
use parking_lot::Mutex;

use crate::agent::Agent;
use crate::errors::Result;
use crate::quarantine::Quarantine;
use crate::region::ForeignRegion;

/// What keeps registered caller memory allocated (dropped once the memory
/// is deregistered and no READ may write it).
pub type Owner = Box<dyn Any + Send + Sync>;

struct Registration {
    /// Declared first: deregistered before the owner lets the memory go.
    _handle: RegistrationHandle,
    addr: usize,
    len: usize,
    /// Deregistration was asked for while quarantined: it happens when the
    /// quarantine ends.
    retired: bool,
    _owner: Option<Owner>,
}

/// One reader's registrations of caller memory, by id.
pub struct ForeignMemory {
    registrations: Mutex<HashMap<u64, Registration>>,
    next_id: AtomicU64,
    quarantine: Quarantine<u64>,
}

impl ForeignMemory {
    /// For a reader whose READs time out after `read_timeout`.
    pub fn new(read_timeout: Duration) -> ForeignMemory {
        ForeignMemory {
            registrations: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            quarantine: Quarantine::new(read_timeout),
        }
    }

    /// Registers `region` with `agent` until [`ForeignMemory::deregister`];
    /// `owner` is kept as long as the registration. Returns its id.
    ///
    /// # Safety
    /// The region must stay allocated while it is registered: `owner`
    /// keeps it so, or else the caller does for the life of the reader.
    pub unsafe fn register(
        &self,
        agent: &Agent,
        region: ForeignRegion,
        owner: Option<Owner>,
    ) -> Result<u64> {
        self.end_due_quarantines();
        let handle = agent.register(&region)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.registrations.lock().insert(
            id,
            Registration {
                _handle: handle,
                addr: region.addr,
                len: region.len,
                retired: false,
                _owner: owner,
            },
        );
        Ok(id)
    }

    /// Gives registration `id` up: deregistered now, or, while a failed
    /// READ may still write it, once its quarantine ends. False for an
    /// unknown id (or one already given up).
    pub fn deregister(&self, id: u64) -> bool {
        self.end_due_quarantines();
        let mut registrations = self.registrations.lock();
        let Some(registration) = registrations.get_mut(&id) else {
            return false;
        };
        if registration.retired {
            return false;
        }
        if self.quarantine.holds(&id) {
            registration.retired = true;
            return true;
        }
        let gone = registrations.remove(&id);
        drop(registrations);
        drop(gone);
        true
    }

    /// The registration that holds `addr..addr+len`, if any.
    pub fn holding(&self, addr: usize, len: usize) -> Option<u64> {
        self.registrations
            .lock()
            .iter()
            .find(|(_, r)| addr >= r.addr && addr.saturating_add(len) <= r.addr + r.len)
            .map(|(&id, _)| id)
    }

    /// After a failed READ into registration `id` that may still land.
    pub fn quarantine(&self, id: u64) {
        self.quarantine.hold(id);
    }

    /// Whether a failed READ may still write registration `id` (no READ
    /// may go into it until this is false).
    pub fn is_quarantined(&self, id: u64) -> bool {
        self.end_due_quarantines();
        self.quarantine.holds(&id)
    }

    /// Registrations held right now, quarantined ones included.
    pub fn count(&self) -> usize {
        self.end_due_quarantines();
        self.registrations.lock().len()
    }

    /// Registrations a failed READ may still write.
    pub fn quarantined_count(&self) -> usize {
        self.end_due_quarantines();
        self.quarantine.len()
    }

    /// Ends the quarantines that are due; registrations given up meanwhile
    /// are deregistered now (outside the lock: deregistering calls NIXL).
    fn end_due_quarantines(&self) {
        let mut due = Vec::new();
        self.quarantine.end_due(Instant::now(), |id| due.push(id));
        if due.is_empty() {
            return;
        }
        let mut gone = Vec::new();
        let mut registrations = self.registrations.lock();
        for id in due {
            if registrations.get(&id).is_some_and(|r| r.retired) {
                gone.extend(registrations.remove(&id));
            }
        }
        drop(registrations);
        drop(gone);
    }
}
