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
//!
//! A frontend no read has used for the reader's idle limit is forgotten
//! (its metadata and UCX endpoints let go): a frontend that died or was
//! taken out of its load balancer sends no more descriptors, and its
//! entry would otherwise stay until 256 others pushed it out. A later
//! descriptor from it connects again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use crate::agent::Agent;
use crate::errors::{Error, Result};
use crate::wire::{self, Source};

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
    /// When a read last took this entry, in nanoseconds after the
    /// [`Remotes`] were made.
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

/// The frontends one reader's agent knows, by agent name.
pub struct Remotes {
    /// Each entry's `Arc` is cloned only under this lock, so an entry whose
    /// only holder is the map has no read in flight and none about to start.
    entries: Mutex<HashMap<String, Arc<Remote>>>,
    /// A frontend unused for this long is forgotten.
    idle: Duration,
    made: Instant,
    /// Loads of a frontend's metadata, by kind (for `stats()`).
    connects: AtomicU64,
    merges: AtomicU64,
}

impl Remotes {
    pub fn new(idle: Duration) -> Remotes {
        Remotes {
            entries: Mutex::new(HashMap::new()),
            idle,
            made: Instant::now(),
            connects: AtomicU64::new(0),
            merges: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.made.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Forgets the frontends no read has used for the idle limit.
    pub fn forget_idle(&self, agent: &Agent) {
        let idle = u64::try_from(self.idle.as_nanos()).unwrap_or(u64::MAX);
        let cutoff = self.now().saturating_sub(idle);
        let mut entries = self.entries.lock();
        let stale: Vec<String> = entries
            .iter()
            .filter(|(_, r)| r.last_used.load(Ordering::Relaxed) < cutoff)
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            forget_unheld(agent, &mut entries, &name);
        }
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

    /// The entry for frontend `name`, made if new, after forgetting the
    /// idle frontends; past [`MAX_REMOTES`] the least recently used
    /// frontends with no read in flight are forgotten too.
    fn entry(&self, agent: &Agent, name: &str) -> Arc<Remote> {
        self.forget_idle(agent);
        let now = self.now();
        let mut entries = self.entries.lock();
        if let Some(remote) = entries.get(name) {
            remote.last_used.store(now, Ordering::Relaxed);
            return Arc::clone(remote);
        }
        if entries.len() >= MAX_REMOTES {
            let mut by_age: Vec<(u64, String)> = entries
                .iter()
                .map(|(n, r)| (r.last_used.load(Ordering::Relaxed), n.clone()))
                .collect();
            by_age.sort();
            for (_, old) in by_age {
                if entries.len() < MAX_REMOTES {
                    break;
                }
                forget_unheld(agent, &mut entries, &old);
            }
        }
        let remote = Arc::new(Remote {
            gate: RwLock::new(()),
            state: Mutex::new(RemoteState::default()),
            last_used: AtomicU64::new(now),
        });
        entries.insert(name.to_string(), Arc::clone(&remote));
        remote
    }
}

/// Forgets frontend `name` unless a read holds its entry.
fn forget_unheld(agent: &Agent, entries: &mut HashMap<String, Arc<Remote>>, name: &str) {
    let Some(remote) = entries.get(name) else {
        return;
    };
    if Arc::strong_count(remote) > 1 {
        return;
    }
    if remote.state.lock().loaded {
        agent.forget_remote(name);
    }
    entries.remove(name);
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
