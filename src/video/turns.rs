//! Turns at decoding: how the decode calls a process gives videos are
//! shared among the videos that want one.
//!
//! A video decode runs for as long as its file asks (a header can make a
//! 300 KB file hours of decoding), so first come, first served would let one
//! video hold a call for minutes while a short clip waits behind it. Here a
//! decode takes a turn before it opens its file and again before it reads,
//! and between packets it hands its turn on to a waiting decode whose
//! client has had less decoding time ("least attained service"): a short
//! video waits at most one quantum for a long one, and a client's several
//! videos count together, so sending more of them buys no larger share.
//! A decode that waits keeps its decoder; nothing is decoded twice.
//!
//! A client whose decodes ended early (its caller went away, or the
//! decoding budget ran out) keeps its decoding time for a while after its
//! last one ([`REMEMBER_FOR`], at most [`REMEMBERED_CLIENTS`] clients): a
//! client that hangs up and sends again resumes where it stopped, rather
//! than starting afresh level with every newcomer. A client whose decodes
//! all finished is forgotten with its last one, so sending the same video
//! again (a conversation's next turn) starts afresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// How much more decoding time a running decode's client may have had than
/// a waiting one's before the running one hands its turn on: long enough
/// that two long videos do not trade turns after every packet.
const QUANTUM: Duration = Duration::from_millis(20);
/// How often a running decode adds its time to its client's (between
/// packets; the lock is taken no more often).
const ACCOUNT_EVERY: Duration = Duration::from_millis(2);
/// How often a waiting decode looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);
/// How long the decoding time of a client whose decodes ended early is
/// kept after its last one.
const REMEMBER_FOR: Duration = Duration::from_secs(600);
/// The most clients whose decoding time is kept with no decode of theirs
/// registered (the oldest is forgotten first).
const REMEMBERED_CLIENTS: usize = 4096;

struct Waiting {
    ticket: u64,
    client: Arc<str>,
    /// Decoding time of this decode itself: of two decodes of one client,
    /// the one that has had less goes first.
    attained: Duration,
}

#[derive(Default)]
struct State {
    /// Decodes that may run at once (0: no decode has ever been admitted
    /// under these turns; `configure` sets it).
    calls: usize,
    running: usize,
    waiting: Vec<Waiting>,
    granted: Vec<u64>,
    /// Decoding time per client with a decode registered, dropped with the
    /// client's last decode (so the map holds only clients decoding now).
    clients: HashMap<Arc<str>, ClientTime>,
    /// Decoding time of clients with no decode registered, and when their
    /// last one ended.
    remembered: HashMap<Arc<str>, Remembered>,
    next_ticket: u64,
}

struct Remembered {
    attained: Duration,
    ended: Instant,
    /// Order of the ends (the oldest is forgotten first).
    seq: u64,
}

#[derive(Default)]
struct ClientTime {
    attained: Duration,
    decodes: usize,
    /// Whether one of its decodes ended early.
    ended_early: bool,
}

impl State {
    fn priority(&self, client: &str, own: Duration) -> Duration {
        self.clients
            .get(client)
            .map_or(Duration::ZERO, |c| c.attained)
            + own
    }

    /// Hands free calls to the waiting decodes that have had least.
    fn grant(&mut self) -> bool {
        let mut any = false;
        while self.running < self.calls.max(1) && !self.waiting.is_empty() {
            let next = (0..self.waiting.len())
                .min_by_key(|&i| {
                    let w = &self.waiting[i];
                    (self.priority(&w.client, w.attained), w.ticket)
                })
                .expect("waiting is not empty");
            let chosen = self.waiting.swap_remove(next);
            self.granted.push(chosen.ticket);
            self.running += 1;
            any = true;
        }
        any
    }

    /// Keeps a client's decoding time once its last decode ends, within
    /// the table's bound.
    fn remember(&mut self, client: Arc<str>, attained: Duration) {
        let now = Instant::now();
        self.remembered
            .retain(|_, r| now.duration_since(r.ended) < REMEMBER_FOR);
        if self.remembered.len() >= REMEMBERED_CLIENTS {
            let oldest = self
                .remembered
                .iter()
                .min_by_key(|(_, r)| r.seq)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                self.remembered.remove(&oldest);
            }
        }
        let seq = self.next_ticket;
        self.next_ticket += 1;
        self.remembered.insert(
            client,
            Remembered {
                attained,
                ended: now,
                seq,
            },
        );
    }

    /// The decoding time a client with no decode registered had, when its
    /// last one ended less than [`REMEMBER_FOR`] ago.
    fn recall(&mut self, client: &str) -> Duration {
        match self.remembered.remove(client) {
            Some(r) if r.ended.elapsed() < REMEMBER_FOR => r.attained,
            _ => Duration::ZERO,
        }
    }

    fn least_waiting(&self) -> Option<Duration> {
        self.waiting
            .iter()
            .map(|w| self.priority(&w.client, w.attained))
            .min()
    }
}

/// The turns of one process's video decodes.
pub struct DecodeTurns {
    state: Mutex<State>,
    changed: Condvar,
}

impl DecodeTurns {
    fn new() -> DecodeTurns {
        DecodeTurns {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }
    }

    /// The process's turns, shared by the frontend's and the plug-in's
    /// decodes.
    pub fn global() -> &'static DecodeTurns {
        static TURNS: OnceLock<DecodeTurns> = OnceLock::new();
        TURNS.get_or_init(DecodeTurns::new)
    }

    /// Sets how many decodes run at once (at least one).
    pub fn configure(&self, calls: usize) {
        let mut state = self.state.lock();
        state.calls = calls.max(1);
        if state.grant() {
            self.changed.notify_all();
        }
    }

    /// Decodes that may run at once.
    pub fn calls(&self) -> usize {
        self.state.lock().calls.max(1)
    }

    /// A decode of `client`'s, which takes its turns through the returned
    /// ticket.
    pub fn register(&'static self, client: &str) -> Ticket {
        let mut state = self.state.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let client: Arc<str> = match state.clients.get_key_value(client) {
            Some((key, _)) => key.clone(),
            None => {
                let attained = state.recall(client);
                let key: Arc<str> = Arc::from(client);
                state.clients.insert(
                    key.clone(),
                    ClientTime {
                        attained,
                        decodes: 0,
                        ended_early: false,
                    },
                );
                key
            }
        };
        state.clients.entry(client.clone()).or_default().decodes += 1;
        Ticket {
            turns: self,
            ticket,
            client,
            attained: Duration::ZERO,
            running_since: None,
            ended_early: false,
        }
    }
}

/// One decode's place in the turns: not running until [`Ticket::start`],
/// and running until [`Ticket::stop`] (or its drop).
pub struct Ticket {
    turns: &'static DecodeTurns,
    ticket: u64,
    client: Arc<str>,
    attained: Duration,
    /// When the time since was last added to the client's.
    running_since: Option<Instant>,
    ended_early: bool,
}

impl Ticket {
    /// Waits for a turn; false when `stop` was set first (the caller went
    /// away), with no turn taken.
    pub fn start(&mut self, stop: Option<&AtomicI32>) -> bool {
        if self.running_since.is_some() {
            return true;
        }
        let turns = self.turns;
        let mut state = turns.state.lock();
        state.waiting.push(Waiting {
            ticket: self.ticket,
            client: self.client.clone(),
            attained: self.attained,
        });
        if state.grant() {
            turns.changed.notify_all();
        }
        if !self.wait_granted(&mut state, stop) {
            return false;
        }
        self.running_since = Some(Instant::now());
        true
    }

    fn wait_granted(
        &self,
        state: &mut parking_lot::MutexGuard<'_, State>,
        stop: Option<&AtomicI32>,
    ) -> bool {
        loop {
            if let Some(at) = state.granted.iter().position(|&t| t == self.ticket) {
                state.granted.swap_remove(at);
                return true;
            }
            if stop.is_some_and(|flag| flag.load(Ordering::Relaxed) != 0) {
                state.waiting.retain(|w| w.ticket != self.ticket);
                return false;
            }
            self.turns.changed.wait_for(state, STOP_POLL);
        }
    }

    /// Between two packets of a running decode: adds the time since the
    /// last call to the client's and, once the client has had a quantum
    /// more than a waiting decode's, hands the turn on and waits for the
    /// next. False when `stop` was set while it waited (no turn held then).
    pub fn pace(&mut self, stop: Option<&AtomicI32>) -> bool {
        let Some(since) = self.running_since else {
            return true;
        };
        let now = Instant::now();
        let spent = now.duration_since(since);
        if spent < ACCOUNT_EVERY {
            return true;
        }
        let turns = self.turns;
        let mut state = turns.state.lock();
        self.attained += spent;
        if let Some(client) = state.clients.get_mut(&self.client) {
            client.attained += spent;
        }
        self.running_since = Some(now);
        let mine = state.priority(&self.client, self.attained);
        match state.least_waiting() {
            Some(least) if least + QUANTUM < mine => {}
            _ => return true,
        }
        state.running -= 1;
        self.running_since = None;
        state.waiting.push(Waiting {
            ticket: self.ticket,
            client: self.client.clone(),
            attained: self.attained,
        });
        state.grant();
        turns.changed.notify_all();
        if !self.wait_granted(&mut state, stop) {
            return false;
        }
        self.running_since = Some(Instant::now());
        true
    }

    /// Marks the decode as ended early (its caller went away, or its budget
    /// ran out): its client's decoding time is remembered past its last
    /// decode.
    pub fn ended_early(&mut self) {
        self.ended_early = true;
    }

    /// Ends a turn (the decode is between steps or done); the next step
    /// [`Ticket::start`]s again.
    pub fn stop(&mut self) {
        let Some(since) = self.running_since.take() else {
            return;
        };
        let spent = since.elapsed();
        self.attained += spent;
        let mut state = self.turns.state.lock();
        if let Some(client) = state.clients.get_mut(&self.client) {
            client.attained += spent;
        }
        state.running -= 1;
        state.grant();
        self.turns.changed.notify_all();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.stop();
        let mut state = self.turns.state.lock();
        state.waiting.retain(|w| w.ticket != self.ticket);
        let last = state.clients.get_mut(&self.client).is_some_and(|client| {
            client.decodes -= 1;
            client.decodes == 0
        });
        if let Some(client) = state.clients.get_mut(&self.client) {
            client.ended_early |= self.ended_early;
        }
        if last {
            if let Some((key, time)) = state.clients.remove_entry(&self.client) {
                if time.ended_early {
                    state.remember(key, time.attained);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::thread;

    fn turns(calls: usize) -> &'static DecodeTurns {
        let turns: &'static DecodeTurns = Box::leak(Box::new(DecodeTurns::new()));
        turns.configure(calls);
        turns
    }

    #[test]
    fn a_short_decode_runs_while_a_long_one_of_another_client_waits() {
        let turns = turns(1);
        let mut long = turns.register("bomb");
        assert!(long.start(None));
        let done = Arc::new(AtomicBool::new(false));
        let victim_done = done.clone();
        let victim = thread::spawn(move || {
            let mut short = turns.register("victim");
            let asked = Instant::now();
            assert!(short.start(None));
            let waited = asked.elapsed();
            thread::sleep(Duration::from_millis(5));
            short.stop();
            victim_done.store(true, Ordering::SeqCst);
            waited
        });
        // The long decode keeps pacing; it must let the victim in within
        // about a quantum of the victim's arrival, and not run meanwhile.
        let started = Instant::now();
        let mut ran_while_victim = false;
        while !done.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(1));
            assert!(long.pace(None));
            if turns.state.lock().running > 1 {
                ran_while_victim = true;
            }
        }
        let waited = victim.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert!(!ran_while_victim, "two decodes ran on one call");
        assert!(
            waited < Duration::from_secs(1),
            "the victim waited {waited:?}"
        );
    }

    #[test]
    fn a_waiting_decode_gives_up_when_stopped_and_holds_no_turn() {
        let turns = turns(1);
        let mut first = turns.register("a");
        assert!(first.start(None));
        let stop = Arc::new(AtomicI32::new(0));
        let flag = stop.clone();
        let waiter = thread::spawn(move || {
            let mut second = turns.register("b");
            second.start(Some(&flag))
        });
        thread::sleep(Duration::from_millis(20));
        stop.store(1, Ordering::SeqCst);
        assert!(!waiter.join().unwrap());
        first.stop();
        let state = turns.state.lock();
        assert_eq!((state.running, state.waiting.len()), (0, 0));
        assert_eq!(
            state.clients.len(),
            1,
            "only the registered first client is known"
        );
    }

    #[test]
    fn a_client_that_comes_back_resumes_its_decoding_time() {
        // "bomb" decodes for a while and hangs up; its next decode and a
        // newcomer's both wait behind a third client's: the newcomer, with
        // less decoding time, goes first although it asked second.
        assert_eq!(comes_back(true), vec!["newcomer", "bomb"]);
        // Had its decode finished, it would start afresh, level with the
        // newcomer: first come, first served between them.
        assert_eq!(comes_back(false), vec!["bomb", "newcomer"]);
    }

    fn comes_back(ended_early: bool) -> Vec<&'static str> {
        let turns = turns(1);
        let mut first = turns.register("bomb");
        assert!(first.start(None));
        thread::sleep(QUANTUM * 3);
        if ended_early {
            first.ended_early();
        }
        drop(first);
        let mut holder = turns.register("holder");
        assert!(holder.start(None));
        let order = Arc::new(Mutex::new(Vec::new()));
        let spawn = |client: &'static str| {
            let order = order.clone();
            thread::spawn(move || {
                let mut ticket = turns.register(client);
                assert!(ticket.start(None));
                order.lock().push(client);
                ticket.stop();
            })
        };
        let bomb = spawn("bomb");
        while turns.state.lock().waiting.is_empty() {
            thread::sleep(Duration::from_millis(1));
        }
        let newcomer = spawn("newcomer");
        while turns.state.lock().waiting.len() < 2 {
            thread::sleep(Duration::from_millis(1));
        }
        holder.stop();
        bomb.join().unwrap();
        newcomer.join().unwrap();
        let order = order.lock().clone();
        order
    }

    #[test]
    fn remembered_clients_are_bounded() {
        let turns = turns(1);
        for i in 0..REMEMBERED_CLIENTS + 10 {
            let mut ticket = turns.register(&format!("client-{i}"));
            assert!(ticket.start(None));
            ticket.ended_early();
        }
        let state = turns.state.lock();
        assert_eq!(state.remembered.len(), REMEMBERED_CLIENTS);
        assert!(state.clients.is_empty());
        assert!(
            !state.remembered.contains_key("client-0"),
            "the oldest goes first"
        );
    }

    #[test]
    fn clients_are_forgotten_with_their_last_decode() {
        let turns = turns(2);
        for _ in 0..3 {
            let mut ticket = turns.register("c");
            assert!(ticket.start(None));
        }
        let state = turns.state.lock();
        assert!(state.clients.is_empty());
        assert_eq!(state.running, 0);
    }
}
