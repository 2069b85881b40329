//! [`Pace`]: what the shim asks between packets, whether the decoding of
//! one capture goes on: not once its caller went away (the stop flag), not
//! past its decoding budget (`max_decode_pixels`), and only on its turn
//! (when the capture takes [`turns`](super::turns)).

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pixelwire_ffmpeg_sys as ffi;

use super::turns::{DecodeTurns, Ticket};
use crate::errors::Result;
use crate::publisher::cancelled;

pub(super) struct Pace {
    /// The flag that stops the shim's work (`BatchControl::stop_flag`).
    stop: Option<Arc<AtomicI32>>,
    /// Packets one handle may decode (`i64::MAX` until the frame size is
    /// known).
    budget: AtomicI64,
    over_budget: AtomicBool,
    /// The capture's place in the process's turns, when it takes them.
    ticket: Mutex<Option<Ticket>>,
    /// Whether it takes them (`ticket` is Some): without turns, a packet
    /// goes on without the lock, which the pieces of a read all share.
    takes_turns: bool,
}

impl Pace {
    /// Shared: the shim holds its address for the handle's life, a
    /// [`Turn`] for the turn's.
    pub(super) fn new(stop: Option<Arc<AtomicI32>>, client: Option<&str>) -> Arc<Pace> {
        Arc::new(Pace {
            stop,
            budget: AtomicI64::new(i64::MAX),
            over_budget: AtomicBool::new(false),
            ticket: Mutex::new(client.map(|client| DecodeTurns::global().register(client))),
            takes_turns: client.is_some(),
        })
    }

    pub(super) fn stop_flag(&self) -> Option<&Arc<AtomicI32>> {
        self.stop.as_ref()
    }

    fn stop_asked(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::Relaxed) != 0)
    }

    /// Packets a handle may decode from now on.
    pub(super) fn set_budget(&self, packets: i64) {
        self.budget.store(packets, Ordering::Relaxed);
    }

    /// Whether the shim stopped because the budget ran out.
    pub(super) fn over_budget(&self) -> bool {
        self.over_budget.load(Ordering::Relaxed)
    }

    /// Waits for the capture's turn (at once without turns): `Cancelled`
    /// when the stop flag is set first.
    fn start(&self) -> Result<()> {
        let stop = self.stop.as_deref();
        let started = self
            .ticket
            .lock()
            .as_mut()
            .is_none_or(|ticket| ticket.start(stop));
        if started {
            Ok(())
        } else {
            Err(cancelled())
        }
    }

    /// Ends the capture's turn; the next step starts again.
    fn end(&self) {
        if let Some(ticket) = self.ticket.lock().as_mut() {
            ticket.stop();
        }
    }

    /// The capture's turn, held until the guard goes.
    pub(super) fn turn(self: &Arc<Self>) -> Result<Turn> {
        self.start()?;
        Ok(Turn(self.clone()))
    }

    fn go_on(&self, packets_decoded: i64) -> bool {
        if self.stop_asked() {
            return false;
        }
        if packets_decoded > self.budget.load(Ordering::Relaxed) {
            self.over_budget.store(true, Ordering::Relaxed);
            return false;
        }
        if !self.takes_turns {
            return true;
        }
        match self.ticket.lock().as_mut() {
            Some(ticket) => ticket.pace(self.stop.as_deref()),
            None => true,
        }
    }

    /// Hands `raw` this pace; `self` must outlive the handle.
    pub(super) fn attach(&self, raw: *mut ffi::pw_video) {
        // SAFETY: `raw` is an open handle; `self` is held by the Capture
        // that owns `raw` and is dropped after `raw` is closed.
        unsafe {
            ffi::pw_video_set_pace(
                raw,
                Some(go_on),
                std::ptr::from_ref(self).cast_mut().cast::<c_void>(),
            );
        }
    }
}

impl Drop for Pace {
    fn drop(&mut self) {
        // A decode that ended early (its caller went away, or its budget ran
        // out) leaves its client's decoding time remembered: the same bytes
        // sent again resume it.
        if self.stop_asked() || self.over_budget() {
            if let Some(ticket) = self.ticket.get_mut().as_mut() {
                ticket.ended_early();
            }
        }
    }
}

/// A capture's turn at decoding, ended when dropped.
pub(super) struct Turn(Arc<Pace>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The shim's `pw_pace`.
unsafe extern "C" fn go_on(opaque: *mut c_void, packets_decoded: i64) -> i32 {
    // SAFETY: `opaque` is the `Pace` `attach` gave, alive while the handle is.
    let pace = unsafe { &*opaque.cast::<Pace>() };
    i32::from(!pace.go_on(packets_decoded))
}
