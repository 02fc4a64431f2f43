//! One database grant — a lease — and the threads that keep it alive.
//!
//! # The deadline invariant
//!
//! **The holder's deadline is never later than the database's expiry of its row.** Every
//! statement that sets the row's expiry (the grant, each renewal) runs `EXPIRED_AFTER =
//! database-now + ttl`, so a statement *sent* at instant `s` with time-to-live `t` leaves the
//! row valid at least until `s + t` (it cannot run before it was sent). The deadline is
//! computed in one place, [`Bounds`], from every statement that may have run:
//!
//! - **Renewals of one lease are serialised** (the keeper and manual renewals take the lease's
//!   *turn* around the statement), so statements whose answer arrived ran in the order they were
//!   sent, and the last *confirmed* one, sent at `s` with `t`, bounds the row: `s + t`.
//! - A renewal whose answer never came (timed out, connection broken, any error) **may still
//!   run later**, after any later statement. If it ran last, it ran after the last confirmed one
//!   was sent, so its bound is `max(its send instant, s) + its ttl`. The deadline is therefore
//!   `min(s + t, s + smallest unknown ttl)` after each confirmed renewal and drops to
//!   `min(deadline, sent + ttl)` at each unknown one. With one time-to-live throughout an unknown
//!   renewal changes nothing; a shorter one keeps bounding the lease for the rest of its life.
//! - **Drift allowance.** The database measures the time-to-live on its own clock, which may run
//!   fast against the holder's monotonic clock (NTP slews up to 500 ppm; SQLite stores
//!   milliseconds). Every bound is shortened by [`drift_allowance`] (1 % of the time-to-live
//!   plus 2 ms), so the holder gives up first unless the clocks drift apart by more than that.
//!
//! # Lease state machine
//!
//! | state | entered when | `is_held()` | left when |
//! |-------|--------------|-------------|-----------|
//! | **held** | the acquire statement returned a token | `true` until the deadline | released, lost |
//! | **releasing** | the last local holder lets go | `false` for nobody (no guard left) | released, lost |
//! | **released** | the release statement answered (or failed) | `false` | — |
//! | **lost** | a renewal found another holder (or none), the deadline passed, or the release found the row gone | `false` | — |
//!
//! Crossing the deadline is a loss even when no thread noticed yet: `is_held()` compares
//! against it directly. **Every loss is reported exactly once** — to the registry's callback and
//! to the loss channels of the lease's *current* holder — by whichever thread notices first: the
//! lease clock at the deadline, a keeper or manual renewal that finds another holder, or the
//! release of a lease that had expired. A loss is never reported once the lease has been
//! released normally, and loss channels of a holder that handed the lock to another thread
//! disconnect at the handoff (its hold ended normally).
//!
//! # Threads
//!
//! **The lease clock** (one thread per process, [`clock`]) keeps a list of live leases and
//! wakes at the earliest moment one of them needs attention: its first renewal is due, or its
//! deadline has passed. A lease whose deadline passes is marked lost right there — even when
//! its keeper is stuck in a database call that does not return (a frozen connection), so a
//! loss is never reported later than the moment another instance could take the lock. A lease
//! whose deadline or renewal moves earlier (a shorter time-to-live) wakes the clock.
//!
//! **A keeper thread** per lease does the renewing. The clock hands a lease to a keeper when
//! its first renewal falls due, so a lease released before that (most short critical sections)
//! never wakes another thread: starting or waking a thread costs more than an SQLite acquire.
//! From then on the keeper is the lease's own: it waits on the lease's condition variable until
//! the next renewal (a third of the time-to-live after the last one was sent, unless configured
//! otherwise; recomputed whenever the lease changes), renews through the registry's renewal
//! pool, and stops as soon as the lease is releasing, released or lost, or the registry is gone
//! (it holds only a `Weak` to the store between renewals). Keepers whose lease ended park for a
//! while and are reused ([`keepers`]). With renewal turned off no keeper is used; the clock
//! reports the loss at the deadline.
//!
//! A local handoff to a thread that asked for another time-to-live does not run a statement on
//! the caller's thread: it records the new time-to-live and asks the keeper to renew now (the
//! deadline stays bounded by what the database has). The callback is user code: a panic in it
//! is caught and logged, so it cannot take the clock or a keeper down.
//!
//! # Fail points (feature `failpoints`, tests only)
//!
//! | name | where |
//! |------|-------|
//! | `lease::renew_waits_for_turn` | a renewal finds another of the same lease in flight |
//! | `lease::renew_before_statement`, `lease::renew_before_record` | around a renew statement |
//! | `lease::keeper_before_turn` | a keeper about to renew |
//! | `lease::loss_channel` | a holder asks for a loss channel |
//! | `lease::clock_before_expiry` | the clock about to report leases whose deadline passed |
//! | `lock::acquire_before_statement`, `lock::release_before_statement` | the poller's acquire, the last holder's release |
//! | `backend::acquire_sent`, `backend::renew_sent` | the instant a statement counts as sent; `renew_sent` can `return` a transient failure |
//! | `leader::agent_watch` | the leader agent about to look at its lease |

use crate::backend::{Grant, Path, Store};
use crate::error::{Error, LossReason};
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// What a registry's loss callback and a guard's loss channel receive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    /// The user's key.
    pub key: String,
    /// The fencing token of the lost lease.
    pub fencing_token: u64,
    /// Why it was lost.
    pub reason: LossReason,
}

/// Called once per lost lease, on the thread that noticed the loss (a keeper, the lease clock,
/// or a caller). A panic in it is caught and logged.
pub type LostCallback = Arc<dyn Fn(&LeaseLost) + Send + Sync>;

/// How the keeper thread behaves; copied from the registry settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeeperSettings {
    /// `false`: never renew, only report the loss at the deadline.
    pub renew: bool,
    /// Renew this long after the last renewal was sent; `None` = a third of the time-to-live.
    pub renew_every: Option<Duration>,
}

/// How much earlier than the database the holder gives up on a lease of `ttl`: 1 % of it plus
/// 2 ms, for a database clock that runs fast against the holder's (see the module docs).
pub fn drift_allowance(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// How long after a statement was sent with `ttl` the holder may still count on the row.
fn holder_span(ttl: Duration) -> Duration {
    ttl.saturating_sub(drift_allowance(ttl))
}

/// What the holder knows about the row's expiry: the one place the deadline is computed (see
/// "The deadline invariant" in the module docs).
#[derive(Debug, Clone)]
struct Bounds {
    /// When the last confirmed statement (grant or renewal) was sent.
    confirmed_sent: Instant,
    /// The smallest time-to-live of a renewal whose outcome is unknown: it may still run.
    unknown_min_ttl: Option<Duration>,
    /// The holder's deadline.
    deadline: Instant,
}

impl Bounds {
    fn granted(sent_at: Instant, ttl: Duration) -> Bounds {
        Bounds {
            confirmed_sent: sent_at,
            unknown_min_ttl: None,
            deadline: sent_at + holder_span(ttl),
        }
    }

    /// A renewal sent at `sent_at` with `ttl` was answered: it ran after everything confirmed
    /// before it (renewals are serialised); only unknown ones may run after it.
    fn confirmed(&mut self, sent_at: Instant, ttl: Duration) {
        let shortest = self.unknown_min_ttl.map_or(ttl, |unknown| unknown.min(ttl));
        self.confirmed_sent = sent_at;
        self.deadline = sent_at + holder_span(shortest);
    }

    /// A renewal sent (at the latest) at `sent_at` with `ttl` got no answer: it may run at any
    /// time from now on.
    fn unknown(&mut self, sent_at: Instant, ttl: Duration) {
        self.unknown_min_ttl = Some(self.unknown_min_ttl.map_or(ttl, |known| known.min(ttl)));
        self.deadline = self.deadline.min(sent_at + holder_span(ttl));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Held,
    /// The last local holder let go; the release statement is about to run.
    Releasing,
    /// Released normally: nothing is reported any more.
    Released,
}

struct State {
    phase: Phase,
    bounds: Bounds,
    /// The time-to-live renewals use: the last one a holder asked for.
    ttl: Duration,
    /// Counts changes of `ttl`, so a renewal knows whether it carried the latest one.
    ttl_version: u64,
    /// A holder asked for a new time-to-live that no renewal has carried yet: the keeper
    /// renews at once.
    renew_now: bool,
    lost: Option<LossReason>,
    /// Loss channels of the current holder.
    listeners: Vec<Sender<LeaseLost>>,
}

/// What a renewal found.
pub(crate) enum Renewal {
    Renewed,
    /// The database records another holder or none; the loss has been reported.
    NotOwner,
    /// No answer in time or a database error; the deadline now accounts for it.
    Failed(Error),
}

/// One grant from the database. Shared by every local holder it is handed to.
pub(crate) struct Lease {
    pub key: Arc<str>,
    pub lock_key: Arc<str>,
    pub token: i64,
    state: Mutex<State>,
    /// Wakes the keeper when the lease changes (new time-to-live, release, loss).
    changed: Condvar,
    /// Held around every renew statement: renewals of one lease never overlap.
    turn: Mutex<()>,
    on_lost: Option<LostCallback>,
}

impl Lease {
    /// The lease of `grant`, watched by the lease clock (which starts its keeper).
    pub fn start(
        key: Arc<str>,
        lock_key: Arc<str>,
        grant: Grant,
        ttl: Duration,
        store: Weak<dyn Store>,
        keeper: KeeperSettings,
        on_lost: Option<LostCallback>,
    ) -> Arc<Lease> {
        let Grant { token, sent_at } = grant;
        let lease = Arc::new(Lease {
            key,
            lock_key,
            token,
            state: Mutex::new(State {
                phase: Phase::Held,
                bounds: Bounds::granted(sent_at, ttl),
                ttl,
                ttl_version: 0,
                renew_now: false,
                lost: None,
                listeners: Vec::new(),
            }),
            changed: Condvar::new(),
            turn: Mutex::new(()),
            on_lost,
        });
        clock::watch(&lease, keepers::Job::new(store, keeper));
        lease
    }

    /// The deadline a grant sent at `sent_at` with `ttl` would have: a grant whose deadline is
    /// already past when it arrives is of no use.
    pub fn grant_deadline(sent_at: Instant, ttl: Duration) -> Instant {
        Bounds::granted(sent_at, ttl).deadline
    }

    /// Held: not lost, and the deadline is still ahead.
    pub fn is_held(&self) -> bool {
        self.loss().is_none()
    }

    /// Why the lease is no longer held, or `None` while it is.
    pub fn loss(&self) -> Option<LossReason> {
        let state = self.state.lock();
        if let Some(reason) = &state.lost {
            return Some(reason.clone());
        }
        (Instant::now() >= state.bounds.deadline).then_some(LossReason::Expired(None))
    }

    /// [`loss`](Self::loss), reporting a passed deadline that nobody reported yet.
    pub fn check(&self) -> Option<LossReason> {
        let reason = self.loss()?;
        self.mark_lost(reason.clone());
        Some(reason)
    }

    pub fn deadline(&self) -> Instant {
        self.state.lock().bounds.deadline
    }

    pub fn ttl(&self) -> Duration {
        self.state.lock().ttl
    }

    /// When the next renewal is due under `settings` (never after the deadline).
    fn renewal_due(state: &State, settings: KeeperSettings) -> Instant {
        if state.renew_now {
            return Instant::now();
        }
        let shortest = state
            .bounds
            .unknown_min_ttl
            .map_or(state.ttl, |unknown| unknown.min(state.ttl));
        let every = settings.renew_every.unwrap_or(shortest / 3);
        (state.bounds.confirmed_sent + every).min(state.bounds.deadline)
    }

    /// When the lease clock must look at this lease next.
    fn due(&self, settings: Option<KeeperSettings>) -> Instant {
        let state = self.state.lock();
        match settings.filter(|settings| settings.renew) {
            Some(settings) => Self::renewal_due(&state, settings),
            None => state.bounds.deadline,
        }
    }

    /// Released normally or already reported lost: nothing left to watch.
    fn is_over(&self) -> bool {
        let state = self.state.lock();
        state.phase != Phase::Held || state.lost.is_some()
    }

    /// A holder asks for `ttl` from now on (a local handoff to a thread that asked for another
    /// time-to-live): the keeper renews with it at once. The deadline does not move until the
    /// database has the new time-to-live.
    pub fn request_ttl(&self, ttl: Duration) {
        let mut state = self.state.lock();
        if state.ttl == ttl {
            return;
        }
        state.ttl = ttl;
        state.ttl_version += 1;
        state.renew_now = true;
        drop(state);
        self.changed.notify_all();
        clock::hurry(Instant::now());
    }

    /// Renews, waiting for the lease's turn until `deadline`, and records what may have
    /// happened. `ttl`: a new time-to-live for this and later renewals (a manual renewal), or
    /// `None` for the lease's current one (the keeper).
    pub fn renew(
        &self,
        store: &dyn Store,
        ttl: Option<Duration>,
        deadline: Instant,
        path: Path,
    ) -> Renewal {
        let started = Instant::now();
        let turn = match self.turn.try_lock() {
            Some(turn) => Some(turn),
            None => {
                fail_point!("lease::renew_waits_for_turn");
                self.turn.try_lock_until(deadline)
            }
        };
        let Some(turn) = turn else {
            return Renewal::Failed(Error::Timeout {
                operation: "renew",
                waited: started.elapsed(),
                source: Some("another renewal of this lease was still running".into()),
            });
        };
        let (ttl, version) = {
            let mut state = self.state.lock();
            if let Some(ttl) = ttl.filter(|ttl| *ttl != state.ttl) {
                state.ttl = ttl;
                state.ttl_version += 1;
            }
            (state.ttl, state.ttl_version)
        };
        let sent_no_earlier_than = Instant::now();
        fail_point!("lease::renew_before_statement");
        let outcome = store.renew(&self.lock_key, self.token, ttl, deadline, path);
        fail_point!("lease::renew_before_record");
        let mut state = self.state.lock();
        let releasing = state.phase != Phase::Held;
        let earlier_deadline = state.bounds.deadline;
        if state.ttl_version == version {
            state.renew_now = false;
        }
        let renewal = match outcome {
            Ok(Some(sent_at)) => {
                state.bounds.confirmed(sent_at, ttl);
                Renewal::Renewed
            }
            Ok(None) => Renewal::NotOwner,
            Err(e) => {
                state.bounds.unknown(sent_no_earlier_than, ttl);
                Renewal::Failed(e)
            }
        };
        let deadline = state.bounds.deadline;
        drop(state);
        drop(turn);
        self.changed.notify_all();
        if deadline < earlier_deadline {
            clock::hurry(deadline);
        }
        if matches!(renewal, Renewal::NotOwner) && !releasing {
            self.mark_lost(LossReason::NotOwner);
        }
        renewal
    }

    /// Marks the lease lost (once, and not after a normal release) and tells the current
    /// holder's listeners and the callback.
    pub fn mark_lost(&self, reason: LossReason) {
        let listeners = {
            let mut state = self.state.lock();
            if state.lost.is_some() || state.phase == Phase::Released {
                return;
            }
            state.lost = Some(reason.clone());
            std::mem::take(&mut state.listeners)
        };
        self.changed.notify_all();
        let event = self.event(reason);
        log::warn!(
            "lease on {:?} (token {}) lost: {}",
            event.key,
            event.fencing_token,
            event.reason
        );
        for listener in listeners {
            let _ = listener.try_send(event.clone());
        }
        if let Some(callback) = &self.on_lost {
            let called =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(&event)));
            if called.is_err() {
                log::error!(
                    "the on_lease_lost callback panicked for {:?}; the panic was caught",
                    event.key
                );
            }
        }
    }

    /// A channel that receives one [`LeaseLost`] if the lease is lost (at once if it already is).
    /// It is disconnected without a message when the current holder's hold ends normally.
    pub fn loss_channel(&self) -> Receiver<LeaseLost> {
        fail_point!("lease::loss_channel");
        let (tx, rx) = crossbeam_channel::bounded(1);
        {
            let mut state = self.state.lock();
            match &state.lost {
                Some(reason) => {
                    let _ = tx.try_send(self.event(reason.clone()));
                    return rx;
                }
                None if state.phase == Phase::Released => return rx,
                None => state.listeners.push(tx),
            }
        }
        self.check();
        rx
    }

    /// The lock passed to another local thread: the previous holder's loss channels disconnect.
    pub fn handed_over(&self) {
        self.state.lock().listeners.clear();
    }

    /// The last holder lets go: the keeper stops, and a loss found from here on (other than by
    /// the release itself) is not reported. A deadline already passed is reported now.
    pub fn begin_release(&self) {
        self.check();
        self.state.lock().phase = Phase::Releasing;
        self.changed.notify_all();
    }

    /// The release is over: nothing is reported from now on. Returns the loss, if one was
    /// reported; the current holder's loss channels disconnect otherwise.
    pub fn end(&self) -> Option<LossReason> {
        let mut state = self.state.lock();
        state.phase = Phase::Released;
        state.listeners.clear();
        let lost = state.lost.clone();
        drop(state);
        self.changed.notify_all();
        lost
    }

    /// The keeper's wait: `true` when a renewal is due, `false` when the keeper should stop.
    fn wait_for_renewal(&self, settings: KeeperSettings) -> bool {
        let mut state = self.state.lock();
        loop {
            if state.phase != Phase::Held || state.lost.is_some() {
                return false;
            }
            let due = Self::renewal_due(&state, settings);
            if Instant::now() >= due {
                return true;
            }
            self.changed.wait_until(&mut state, due);
        }
    }

    fn event(&self, reason: LossReason) -> LeaseLost {
        LeaseLost {
            key: self.key.to_string(),
            fencing_token: self.token as u64,
            reason,
        }
    }
}

/// The keeper thread's body (renewal on); see the module docs.
fn keep(lease: Arc<Lease>, store: Weak<dyn Store>, settings: KeeperSettings) {
    while lease.wait_for_renewal(settings) {
        if lease.check().is_some() {
            return;
        }
        let Some(store) = store.upgrade() else { return };
        fail_point!("lease::keeper_before_turn");
        let deadline = lease.deadline();
        match lease.renew(&*store, None, deadline, Path::Renewal) {
            Renewal::Renewed => {}
            Renewal::NotOwner => return,
            // The store retried until the deadline, or the failure is permanent.
            Renewal::Failed(e) => {
                if !lease.is_over() {
                    lease.mark_lost(LossReason::Expired(Some(e.to_string())));
                }
                return;
            }
        }
    }
}

/// Keeper threads, reused: a keeper whose lease ended parks for up to
/// [`keepers::IDLE_LIFETIME`] waiting for the next lease instead of exiting. Each lease being
/// renewed has a thread of its own; an idle keeper holds no reference to any registry.
pub(crate) mod keepers {
    use super::{keep, KeeperSettings, Lease};
    use crate::backend::Store;
    use crossbeam_channel::{Receiver, Sender};
    use std::sync::{Arc, OnceLock, Weak};
    use std::time::Duration;

    /// How long a keeper thread without a lease waits for one before exiting.
    pub const IDLE_LIFETIME: Duration = Duration::from_secs(10);

    /// What a keeper needs to look after one lease; held by the clock until renewal is due.
    pub(crate) struct Job {
        store: Weak<dyn Store>,
        pub settings: KeeperSettings,
    }

    impl Job {
        pub fn new(store: Weak<dyn Store>, settings: KeeperSettings) -> Job {
            Job { store, settings }
        }
    }

    type Work = (Arc<Lease>, Job);

    /// A rendezvous channel: a send succeeds only when an idle keeper is waiting in `recv`.
    fn channel() -> &'static (Sender<Work>, Receiver<Work>) {
        static JOBS: OnceLock<(Sender<Work>, Receiver<Work>)> = OnceLock::new();
        JOBS.get_or_init(|| crossbeam_channel::bounded(0))
    }

    /// Runs `job` on an idle keeper thread, or on a new one.
    pub(crate) fn start(lease: Arc<Lease>, job: Job) {
        let work = match channel().0.try_send((lease, job)) {
            Ok(()) => return,
            Err(refused) => refused.into_inner(),
        };
        let key = Arc::clone(&work.0.key);
        let spawned = std::thread::Builder::new()
            .name("leasehold-keeper".into())
            .spawn(move || {
                let mut work = Some(work);
                while let Some((lease, job)) = work.take() {
                    keep(lease, job.store, job.settings);
                    work = channel().1.recv_timeout(IDLE_LIFETIME).ok();
                }
            });
        if let Err(e) = spawned {
            log::error!("could not start the keeper thread of {key:?}: {e}");
        }
    }
}

/// The lease clock: one process-wide thread that starts keepers when renewal falls due and
/// reports leases whose deadline passed (see the module docs).
///
/// It holds `Weak` references only. It sleeps until the earliest moment a lease needs it, and
/// at most [`clock::IDLE_TICK`] at a time; registering a lease, or a lease whose next moment
/// moves earlier ([`clock::hurry`]), wakes it only when that moment is sooner than its wake-up.
/// Ended leases are dropped from its list on each scan, and by `watch` when the list doubles.
pub(crate) mod clock {
    use super::keepers::{self, Job};
    use super::Lease;
    use crate::error::LossReason;
    use parking_lot::{Condvar, Mutex};
    use std::sync::{Arc, OnceLock};
    use std::time::{Duration, Instant};

    /// The longest the clock sleeps without looking at its list.
    pub const IDLE_TICK: Duration = Duration::from_secs(1);

    /// One watched lease; `job` is `Some` until its keeper has been started.
    struct Entry {
        lease: std::sync::Weak<Lease>,
        job: Option<Job>,
    }

    impl Entry {
        /// When the clock must look at this lease next.
        fn due(&self, lease: &Lease) -> Instant {
            lease.due(self.job.as_ref().map(|job| job.settings))
        }
    }

    struct Watched {
        entries: Vec<Entry>,
        next_wake: Option<Instant>,
        running: bool,
        prune_at: usize,
    }

    fn state() -> &'static (Mutex<Watched>, Condvar) {
        static STATE: OnceLock<(Mutex<Watched>, Condvar)> = OnceLock::new();
        STATE.get_or_init(|| {
            let watched = Watched {
                entries: Vec::new(),
                next_wake: None,
                running: false,
                prune_at: 64,
            };
            (Mutex::new(watched), Condvar::new())
        })
    }

    /// Watches `lease`; its keeper `job` starts when the first renewal is due.
    pub(crate) fn watch(lease: &Arc<Lease>, job: Job) {
        let (watched, wake) = state();
        let entry = Entry {
            lease: Arc::downgrade(lease),
            job: Some(job),
        };
        let due = entry.due(lease);
        let mut list = watched.lock();
        if list.entries.len() >= list.prune_at {
            list.entries
                .retain(|entry| entry.lease.upgrade().is_some_and(|lease| !lease.is_over()));
            list.prune_at = (2 * list.entries.len()).max(64);
        }
        list.entries.push(entry);
        if !list.running {
            list.running = true;
            let started = std::thread::Builder::new()
                .name("leasehold-clock".into())
                .spawn(run);
            if let Err(e) = started {
                list.running = false;
                log::error!("could not start the lease clock thread: {e}");
            }
        } else if list.next_wake.is_none_or(|next| due < next) {
            wake.notify_one();
        }
    }

    /// A watched lease needs the clock at `due`, maybe sooner than it planned.
    pub(crate) fn hurry(due: Instant) {
        let (watched, wake) = state();
        let list = watched.lock();
        if list.running && list.next_wake.is_none_or(|next| due < next) {
            wake.notify_one();
        }
    }

    fn run() {
        let (watched, wake) = state();
        let mut list = watched.lock();
        loop {
            let now = Instant::now();
            let mut next_wake = now + IDLE_TICK;
            let mut expired = Vec::new();
            let mut keepers_due = Vec::new();
            list.entries.retain_mut(|entry| {
                let Some(lease) = entry.lease.upgrade() else {
                    return false;
                };
                if lease.is_over() {
                    return false;
                }
                if lease.deadline() <= now {
                    expired.push(lease);
                    return false;
                }
                if entry.due(&lease) <= now {
                    if let Some(job) = entry.job.take() {
                        keepers_due.push((lease.clone(), job));
                    }
                }
                next_wake = next_wake.min(entry.due(&lease));
                true
            });
            list.next_wake = Some(next_wake);
            if !expired.is_empty() || !keepers_due.is_empty() {
                drop(list);
                if !expired.is_empty() {
                    fail_point!("lease::clock_before_expiry");
                }
                for lease in expired {
                    lease.mark_lost(LossReason::Expired(None));
                }
                for (lease, job) in keepers_due {
                    keepers::start(lease, job);
                }
                list = watched.lock();
                continue;
            }
            wake.wait_until(&mut list, next_wake);
        }
    }
}
