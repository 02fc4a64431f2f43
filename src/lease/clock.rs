//! The lease clock: one process-wide thread that hands leases to their registry's [`Renewer`]
//! when their renewal falls due, and reports leases whose deadline passed (see the `lease`
//! module docs). It runs no user code and waits for no database.
//!
//! It holds `Weak` references only. It sleeps until the earliest moment a lease needs it, and
//! at most [`IDLE_TICK`] at a time; registering a lease, or a lease whose next moment
//! moves earlier ([`hurry`]), wakes it only when that moment is sooner than its wake-up.
//! It wakes a sixteenth of a renewal period before a lease is due and then hands over every
//! lease due within the next eighth, so leases due in the same window travel in one batch.
//! Ended leases are dropped from its list on each scan, and by `watch` when the list doubles;
//! `watch` also drops the gone ones at the end of the list (the last lease of a thread that
//! locks in a loop), which frees their memory for the next.

use super::{ClockLook, Lease, Renewer};
use crate::error::LossReason;
use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The longest the clock sleeps without looking at its list.
pub const IDLE_TICK: Duration = Duration::from_secs(1);

struct Watched {
    leases: Vec<Weak<Lease>>,
    next_wake: Option<Instant>,
    running: bool,
    /// The clock is looking at its leases (they are out of `leases` meanwhile).
    scanning: bool,
    /// The earliest moment asked for while the clock was looking ([`hurry`], [`watch`]).
    asked: Option<Instant>,
    prune_at: usize,
}

impl Watched {
    /// A lease needs the clock at `due`: remembered while it looks, or wakes it if that is
    /// sooner than its wake-up.
    fn ask(&mut self, due: Instant, wake: &Condvar) {
        if self.scanning {
            self.asked = Some(self.asked.map_or(due, |asked| asked.min(due)));
        } else if self.next_wake.is_none_or(|next| due < next) {
            wake.notify_one();
        }
    }
}

fn state() -> &'static (Mutex<Watched>, Condvar) {
    static STATE: OnceLock<(Mutex<Watched>, Condvar)> = OnceLock::new();
    STATE.get_or_init(|| {
        let watched = Watched {
            leases: Vec::new(),
            next_wake: None,
            running: false,
            scanning: false,
            asked: None,
            prune_at: 64,
        };
        (Mutex::new(watched), Condvar::new())
    })
}

/// Watches `lease` until it is released or lost.
pub(crate) fn watch(lease: &Arc<Lease>) {
    let (watched, wake) = state();
    let due = lease.clock_due();
    let mut list = watched.lock();
    // Leases gone since they were watched, at the end of the list (a thread locking one key
    // after another leaves its last one there): dropped now, so that their memory is freed
    // for the next lease (reused warm) instead of at the next prune.
    while list
        .leases
        .last()
        .is_some_and(|lease| lease.strong_count() == 0)
    {
        list.leases.pop();
    }
    if list.leases.len() >= list.prune_at {
        list.leases
            .retain(|lease| lease.upgrade().is_some_and(|lease| !lease.is_over()));
        list.prune_at = (2 * list.leases.len()).max(64);
    }
    list.leases.push(Arc::downgrade(lease));
    if !list.running {
        list.running = true;
        let started = std::thread::Builder::new()
            .name("leasehold-clock".into())
            .spawn(run);
        if let Err(e) = started {
            list.running = false;
            log::error!("could not start the lease clock thread: {e}");
        }
    } else {
        list.ask(due, wake);
    }
}

/// A watched lease needs the clock at `due`, maybe sooner than it planned.
pub(crate) fn hurry(due: Instant) {
    let (watched, wake) = state();
    let mut list = watched.lock();
    if list.running {
        list.ask(due, wake);
    }
}

/// The clock's loop. Each round looks at every lease once (one lock of each), without holding
/// the list: `watch` and `hurry` never wait for a round, and a lease watched meanwhile joins
/// the list when it ends. A round that took `t` is followed by at least `t` of rest, even when
/// a lease asks for the clock sooner, so that with a list long enough to take a while the clock
/// looks at most half the time; a deadline is still reported within two rounds of passing.
fn run() {
    let (watched, wake) = state();
    let mut list = watched.lock();
    loop {
        let mut leases = std::mem::take(&mut list.leases);
        list.scanning = true;
        list.asked = None;
        drop(list);
        let now = Instant::now();
        let mut next_wake = now + IDLE_TICK;
        let mut expired = Vec::new();
        let mut due: Vec<(Arc<Renewer>, Vec<Arc<Lease>>)> = Vec::new();
        leases.retain(|weak| {
            let Some(lease) = weak.upgrade() else {
                return false;
            };
            match lease.clock_look(now) {
                ClockLook::Over => false,
                ClockLook::Expired => {
                    expired.push(lease);
                    false
                }
                ClockLook::Renew(renewer, deadline) => {
                    next_wake = next_wake.min(deadline);
                    match due.iter_mut().find(|(r, _)| Arc::ptr_eq(r, &renewer)) {
                        Some((_, leases)) => leases.push(lease),
                        None => due.push((renewer, vec![lease])),
                    }
                    true
                }
                ClockLook::Later(at) => {
                    next_wake = next_wake.min(at);
                    true
                }
            }
        });
        let looked = now.elapsed();
        if !expired.is_empty() {
            fail_point!("lease::clock_before_expiry");
        }
        for lease in expired {
            let reason = lease.loss().unwrap_or(LossReason::Expired(None));
            lease.mark_lost(reason);
        }
        for (renewer, leases) in due {
            renewer.submit(leases);
        }
        list = watched.lock();
        let added = std::mem::replace(&mut list.leases, leases);
        list.leases.extend(added);
        list.prune_at = (2 * list.leases.len()).max(64);
        list.scanning = false;
        if let Some(asked) = list.asked.take() {
            next_wake = next_wake.min(asked);
        }
        let rest_until = Instant::now() + looked;
        let next_wake = next_wake.max(rest_until);
        list.next_wake = Some(next_wake);
        wake.wait_until(&mut list, next_wake);
        // Woken sooner (a lease needs the clock sooner): the rest still lasts as long as the
        // round took; the next round looks at every lease anyway.
        while Instant::now() < rest_until {
            wake.wait_until(&mut list, rest_until);
        }
    }
}
