//! The frontends a reader READs from, as remote agents of its own: each
//! one's metadata is loaded once and reloaded only for a newer version (the
//! frontend's registered set changed) or after a failed transfer; a reload
//! waits for the reads in flight against that frontend and no read starts
//! during one, so no read ever sees a frontend half-reloaded.
//!
//! A newer version whose changes only added regions (no region dropped
//! since the version loaded: the descriptor's `metadata_pruned`) is merged
//! into the loaded agent, which NIXL does in microseconds, where a
//! reconnect (forget the agent, load it again: every UCX thread's endpoint
//! made anew) took tens of milliseconds while the reads behind it waited.
//! After a region was dropped, or a failed transfer, the reader reconnects:
//! a merge would keep the dropped region's registration, which a new
//! region at the same address must not inherit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::agent::Agent;
use crate::errors::{Error, Result};
use crate::reader::Source;
use crate::wire;

/// Agent metadata is a few hundred bytes; refuse anything absurd.
const MAX_METADATA: usize = 1 << 20;
/// Frontends remembered at once; the least recently used idle one goes first.
const MAX_REMOTES: usize = 256;
/// How long a reconnect to a frontend that failed a transfer is retried.
const RECONNECT_FOR: Duration = Duration::from_secs(2);

/// What is loaded for one frontend.
#[derive(Default)]
struct RemoteState {
    loaded: bool,
    /// False after a failed transfer: the next read reloads first.
    healthy: bool,
    version: Option<u64>,
    metadata: String,
}

impl RemoteState {
    fn serves(&self, source: &Source) -> bool {
        self.loaded
            && self.healthy
            && match source.metadata_version {
                Some(wanted) => self.version.is_some_and(|v| v >= wanted),
                None => self.metadata == source.metadata,
            }
    }

    /// Whether the source's metadata is newer than what is loaded.
    fn is_older_than(&self, source: &Source) -> bool {
        !self.loaded
            || match (source.metadata_version, self.version) {
                (Some(wanted), Some(have)) => wanted > have,
                _ => self.metadata != source.metadata,
            }
    }
}

/// One frontend: reads hold `gate` shared for their whole transfer; a
/// (re)load holds it exclusively.
pub struct Remote {
    gate: RwLock<()>,
    state: Mutex<RemoteState>,
    last_used: AtomicU64,
}

impl Remote {
    /// Held by a read for its whole transfer: no (re)load starts meanwhile.
    pub fn reading(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }

    /// After a transfer that failed once posted (the connection may be
    /// broken): the next read reloads the metadata, once the reads in
    /// flight are done.
    pub fn mark_broken(&self) {
        self.state.lock().healthy = false;
    }
}

#[derive(Default)]
struct Entries {
    by_name: HashMap<String, Arc<Remote>>,
    clock: u64,
}

/// The frontends one reader's agent knows, by agent name.
#[derive(Default)]
pub struct Remotes {
    entries: Mutex<Entries>,
    /// Loads of a frontend's metadata, by kind (for `stats()`).
    connects: AtomicU64,
    merges: AtomicU64,
}

impl Remotes {
    pub fn new() -> Remotes {
        Remotes::default()
    }

    /// (connects: loads that made the connection, first or again; merges:
    /// newer metadata added to a loaded frontend without reconnecting).
    pub fn load_counts(&self) -> (u64, u64) {
        (
            self.connects.load(Ordering::Relaxed),
            self.merges.load(Ordering::Relaxed),
        )
    }

    /// Frontends whose metadata is loaded right now.
    pub fn loaded_count(&self) -> usize {
        self.entries
            .lock()
            .by_name
            .values()
            .filter(|r| r.state.lock().loaded)
            .count()
    }

    /// The frontend `source` names (its agent name, and its entry), loaded
    /// into `agent` with metadata at least as new as the source's. Fails
    /// before any transfer (nothing to quarantine).
    pub fn connect(
        &self,
        agent: &Agent,
        source: &Source,
        deadline: Instant,
    ) -> Result<(String, Arc<Remote>)> {
        let raw = || wire::unpack_metadata(&source.metadata, MAX_METADATA);
        let name = if source.agent.is_empty() {
            wire::metadata_agent_name(&raw()?)?
        } else {
            source.agent.clone()
        };
        let remote = self.entry(agent, &name);
        loop {
            if remote.state.lock().serves(source) {
                return Ok((name, remote));
            }
            let _exclusive = remote.gate.write();
            let mut state = remote.state.lock();
            if state.serves(source) {
                continue;
            }
            // The newest metadata known: the source's, or what is loaded
            // (reloaded after a failure, never replaced by an older one).
            let (metadata, version) = if state.is_older_than(source) {
                (source.metadata.clone(), source.metadata_version)
            } else {
                (state.metadata.clone(), state.version)
            };
            let bytes = wire::unpack_metadata(&metadata, MAX_METADATA)?;
            let named = wire::metadata_agent_name(&bytes)?;
            if named != name {
                return Err(Error::Descriptor(format!(
                    "descriptor names agent {name:?} but its metadata belongs to {named:?}"
                )));
            }
            let grown_only = state.loaded
                && state.healthy
                && matches!(
                    (source.metadata_pruned, state.version),
                    (Some(pruned), Some(have)) if pruned <= have
                );
            // A failed merge leaves the agent as it was: reconnect then.
            if grown_only && agent.load_remote(&bytes).is_ok() {
                self.merges.fetch_add(1, Ordering::Relaxed);
            } else {
                let reload = state.loaded;
                if reload {
                    agent.forget_remote(&name);
                    state.loaded = false;
                }
                load(agent, &bytes, reload, deadline)?;
                self.connects.fetch_add(1, Ordering::Relaxed);
            }
            *state = RemoteState {
                loaded: true,
                healthy: true,
                version,
                metadata,
            };
        }
    }

    /// The entry for frontend `name`, made if new; past [`MAX_REMOTES`] the
    /// least recently used frontends with no read in flight are forgotten.
    fn entry(&self, agent: &Agent, name: &str) -> Arc<Remote> {
        let mut remotes = self.entries.lock();
        remotes.clock += 1;
        let now = remotes.clock;
        if let Some(remote) = remotes.by_name.get(name) {
            remote.last_used.store(now, Ordering::Relaxed);
            return Arc::clone(remote);
        }
        if remotes.by_name.len() >= MAX_REMOTES {
            let mut idle: Vec<(u64, String)> = remotes
                .by_name
                .iter()
                .map(|(n, r)| (r.last_used.load(Ordering::Relaxed), n.clone()))
                .collect();
            idle.sort();
            for (_, old) in idle {
                if remotes.by_name.len() < MAX_REMOTES {
                    break;
                }
                let remote = Arc::clone(&remotes.by_name[&old]);
                let idle = remote.gate.try_write().is_some_and(|_exclusive| {
                    if std::mem::take(&mut remote.state.lock().loaded) {
                        agent.forget_remote(&old);
                    }
                    true
                });
                if idle {
                    remotes.by_name.remove(&old);
                }
            }
        }
        let remote = Arc::new(Remote {
            gate: RwLock::new(()),
            state: Mutex::new(RemoteState::default()),
            last_used: AtomicU64::new(now),
        });
        remotes
            .by_name
            .insert(name.to_string(), Arc::clone(&remote));
        remote
    }
}

/// Loads a frontend's metadata (connects to it). A reload after a
/// failed transfer is tried again for up to [`RECONNECT_FOR`] (within
/// the read's deadline): the UCX backend's threads tear their old
/// endpoints down in the background, and a connect right after a link
/// came back can fail until they have.
fn load(agent: &Agent, metadata: &[u8], reload: bool, deadline: Instant) -> Result<()> {
    let until = deadline.min(Instant::now() + RECONNECT_FOR);
    loop {
        match agent.load_remote(metadata) {
            Ok(_) => return Ok(()),
            Err(e) if !reload || Instant::now() >= until => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
