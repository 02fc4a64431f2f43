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
//! - **Renewals of one lease are serialised** (background and manual renewals take the lease's
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
//! - **Fenced transactions** (see [`crate::fence`]): a fence's statement, sent at `f`, moves
//!   the row's expiry to at least database-now + `t` inside the user's transaction and locks
//!   the row until the transaction ends, which a background renewal cannot do (it skips the
//!   locked row, or waits for the SQLite file). While that transaction is open, no other
//!   holder can be granted the row, and the deadline is at least `f + t` (less the drift
//!   allowance, and no later than the server's idle bound ends the transaction); on its commit
//!   the row keeps the new expiry, so `f + t` bounds it like a confirmed renewal's — with the
//!   shortest time-to-live of a renewal in flight or unknown, which may run after the commit;
//!   on any other end the row is as before, and so is the deadline. The one gap: the server
//!   ends the transaction without the holder's knowing (see "The lease while fenced" in
//!   [`crate::fence`]).
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
//! lease clock at the deadline, a background or manual renewal that finds another holder, or the
//! release of a lease that had expired. A loss is never reported once the lease has been
//! released normally, and loss channels of a holder that handed the lock to another thread
//! disconnect at the handoff (its hold ended normally).
//!
//! # Threads
//!
//! **The lease clock** (one thread per process, [`clock`]; it runs no user code and waits for no
//! database) keeps a list of live leases and wakes at the earliest moment one of them needs
//! attention: its renewal is nearly due, or its deadline has passed. A lease whose deadline
//! passes is marked lost right there — even when its renewal is stuck in a database call that
//! does not return (a frozen connection). A lease whose deadline or renewal moves earlier (a
//! shorter time-to-live) wakes the clock. Each look at the list costs one lock of each lease
//! and holds up no other thread, and the clock rests at least as long as its last look took,
//! so a passed deadline is reported within two looks (each a few milliseconds for a hundred
//! thousand leases in a release build), however many leases run out together. A renewal
//! worker that finds a lease past its deadline, or gets an answer for it after its deadline,
//! reports it at once.
//!
//! **Renewal workers, per registry** ([`Renewer`]) do the renewing. The clock hands them the
//! leases whose renewal is due within the next eighth of their renewal period (a third of the
//! time-to-live after the last renewal was sent, unless configured otherwise), so leases due
//! together are renewed together: one statement per time-to-live and [`MAX_BATCH`](renewer::MAX_BATCH) leases, on the
//! registry's renewal pool. A lease released before its first renewal (most short critical
//! sections) never reaches them. Each lease keeps its own responsibility: its turn, its deadline,
//! its loss report; a batch whose answer never comes only bounds the deadlines of its leases
//! (see above), which are retried and, if their deadlines pass, reported one by one by the
//! clock. One attempt gets half a renewal period at most, never runs past the last deadline
//! among its leases, nor past half the slack of any lease it may hold back (see "Bounds" on
//! [`Renewer`]), so that a statement stuck on a hung server or a frozen connection is retried
//! on a new connection — to the new primary after a failover — before the deadline. A lease
//! counts an answer only if it comes before its own deadline, and one whose deadline passed
//! before its statement was sent is left out of it: how late one lease is never shortens the
//! attempt of another.
//! With renewal turned off no renewal runs; the clock reports the loss at the deadline.
//!
//! # Isolation
//!
//! Nothing one lease, callback or row does can break another lease's guarantee:
//!
//! - **No user code on shared threads.** The loss callback runs on its registry's callback
//!   thread ([`callback_thread`]), after the lease is marked lost and its loss channels have
//!   fired. The clock marks every expired lease lost and sends its channels without waiting for
//!   anything; a blocking callback delays only later callbacks of its own registry.
//! - **A slow statement delays only its leases.** A chunk submitted while every worker is busy
//!   starts another worker (up to one per renewal connection), so a statement that hangs holds up
//!   only the leases it carries; with every worker busy, each attempt ends early enough that a
//!   lease queued behind it still gets a worker before its deadline, whatever its time-to-live.
//! - **A late lease costs only itself.** A lease whose renewal runs late (a starved machine, a
//!   statement that was given up) is lost at its own deadline if no renewal of its own is
//!   confirmed before it; the leases renewed in the same statement keep their whole attempt.
//! - **A locked row costs only its own lease.** The batch renewal skips rows another session
//!   holds locked (`FOR UPDATE SKIP LOCKED` on PostgreSQL and MySQL/MariaDB) and never waits for
//!   them; such a lease is retried alone a quarter period later, and if its row stays locked past
//!   its deadline it is reported lost as *expired* with the reason (the row was never found to have
//!   another holder). Even a single lease renews through the batch statement, so no renewal
//!   worker ever waits for a locked row. No renewal holds a row lock past its own statement
//!   (on MySQL the batch is one `UPDATE` in autocommit), so a holder frozen mid-renewal blocks
//!   its keys only until its leases run out. A custom renew statement (`renew_sql`) runs one
//!   plain statement per lease and may wait.
//! - **A shorter time-to-live bounds the deadline from the moment it may run.** When a renewal
//!   carrying a shorter time-to-live than the lease's last takes its turn (a local handoff to a
//!   thread that asked for it, `renew_with_ttl`), the deadline drops at once to its send instant
//!   plus that time-to-live, before the statement is sent.
//! - **A finished lease cannot touch its row.** Release clears `CLIENT_ID`, and
//!   `unlock_keeping_for` raises `FENCING_TOKEN` by one, so a renewal still in flight, or one that
//!   timed out and runs late on the server, matches neither and cannot extend or cut short what the
//!   release left.
//!
//! A local handoff to a thread that asked for another time-to-live does not run a statement on
//! the caller's thread: it records the new time-to-live and asks for a renewal now (the
//! deadline stays bounded by what the database has).
//!
//! # Fail points (feature `failpoints`, tests only)
//!
//! | name | where |
//! |------|-------|
//! | `lease::renew_waits_for_turn` | a renewal finds another of the same lease in flight |
//! | `lease::renew_before_statement`, `lease::renew_before_record` | around a renew statement |
//! | `lease::renewer_queued` | the lease clock has queued leases whose renewal falls due with their registry's renewer |
//! | `lease::renew_batch_before_statement`, `lease::renew_batch_before_record` | a renewal worker about to send a batch, and about to record its outcome |
//! | `lease::loss_channel` | a holder asks for a loss channel |
//! | `lease::clock_before_expiry` | the clock about to report leases whose deadline passed |
//! | `lock::acquire_before_statement`, `lock::release_before_statement` | the poller's acquire, the last holder's release |
//! | `lock::queued`, `lock::waiter_woken` | a thread has joined a key's local queue; a waiting thread woken, before it looks at the key again (outside the key's mutex) |
//! | `lock::background_job_starts` | a key's job in the background (a resolution, leaving the line) about to run |
//! | `backend::leave_line` | a registry about to delete its place in a key's waiting line |
//! | `backend::acquire_sent`, `backend::renew_sent` | the instant a statement counts as sent; `renew_sent` can `return` a transient failure |
//! | `backend::renewal_hangs` | a renewal attempt; `return(ms)` makes one whose deadline is more than `ms` away get no answer before its deadline |
//! | `mysql::renew_batch_between_statements` | MySQL's batch renewal after its `UPDATE`, before it reads which rows it renewed |
//! | `mysql::watcher_name_held`, `mysql::watcher_before_look` | a release watcher whose `GET_LOCK` timed out (another session holds the key's name), and one whose `GET_LOCK` returned 1, about to read the row |
//! | `sqlite_board::waiter_before_presence` | a thread waiting for an SQLite lock about to become present on the board |
//! | `sqlite_board::listener_woken` | SQLite's board listener back from its wait on the release sequence |
//! | `leader::agent_watch` | the leader agent about to look at its lease |
//! | `semaphore::claim_before_lock` | a waiter that claimed a permit offered by a releasing thread, about to queue on the slot's lock |

use crate::backend::{Grant, Path, Store};
use crate::error::{Error, LossReason};
use crate::meter::Meter;
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

/// Called once per lost lease, on a thread of the registry's own (see
/// `RegistryBuilder::on_lease_lost`). A panic in it is caught and logged.
pub type LostCallback = Arc<dyn Fn(&LeaseLost) + Send + Sync>;

/// Where a lease sends its loss event for the registry's callback (see [`callback_thread`]).
pub(crate) type LossSink = Sender<LeaseLost>;

/// Starts the thread that runs a registry's loss callback, one event after another, and returns
/// the sender its leases report to. User code never runs on the lease clock, a renewal worker or
/// a thread of another registry: a slow or blocking callback delays only later callbacks of its
/// own registry. The thread ends when the registry and all its leases are gone (every sender
/// dropped).
pub(crate) fn callback_thread(callback: LostCallback) -> std::io::Result<LossSink> {
    let (sink, events) = crossbeam_channel::unbounded::<LeaseLost>();
    std::thread::Builder::new()
        .name("leasehold-callback".into())
        .spawn(move || {
            for event in events {
                let called =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| callback(&event)));
                if called.is_err() {
                    log::error!(
                        "the on_lease_lost callback panicked for {:?}; the panic was caught",
                        event.key
                    );
                }
            }
        })?;
    Ok(sink)
}

/// How background renewal behaves; copied from the registry settings.
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

    /// A fenced transaction whose check was sent at `sent_at` and set the row's expiry to at
    /// least the database's now + `ttl` committed: the row holds until then at least, and
    /// only statements that were in flight or unknown may set it shorter, which `ttl` (the
    /// shortest of them) accounts for.
    fn fence_committed(&mut self, sent_at: Instant, ttl: Duration) {
        self.confirmed_sent = self.confirmed_sent.max(sent_at);
        self.deadline = self.deadline.max(sent_at + holder_span(ttl));
    }

    /// A renewal with `ttl` is about to be sent, no earlier than `now`: from the moment it may
    /// run, the row may expire at its send instant + `ttl`, which a shorter time-to-live than
    /// the last one makes earlier than the deadline.
    fn sending(&mut self, now: Instant, ttl: Duration) {
        self.deadline = self.deadline.min(now + holder_span(ttl));
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
    /// A holder asked for a new time-to-live that no renewal has carried yet: renew at once.
    renew_now: bool,
    /// A renew statement of this lease is in flight (the lease's *turn*): renewals never overlap.
    renewing: bool,
    /// Handed to the renewer and not yet renewed.
    queued: bool,
    /// After a failed background renewal: not before this instant again.
    retry_at: Option<Instant>,
    /// The last background renewal error, reported with a loss at the deadline.
    last_error: Option<String>,
    lost: Option<LossReason>,
    /// Loss channels of the current holder.
    listeners: Vec<Sender<LeaseLost>>,
    /// Fenced transactions of this lease that passed their check and are still open (see
    /// "Fenced transactions" in the module docs).
    fences: Vec<FenceHold>,
    /// Numbers the fenced transactions of this lease.
    fence_count: u64,
}

/// What an open fenced transaction holds the row until: its check, sent at `sent_at`, set
/// the row's expiry to at least the database's now + `ttl`; the server ends the transaction
/// no sooner than `idle` after that statement.
#[derive(Debug, Clone)]
struct FenceHold {
    id: u64,
    sent_at: Instant,
    ttl: Duration,
    idle: Option<Duration>,
    /// The thread that fenced it.
    thread: std::thread::ThreadId,
}

impl State {
    /// The holder's deadline: the database's bound ([`Bounds`]), or later while a fenced
    /// transaction of this lease holds its row locked (see "Fenced transactions").
    fn deadline(&self) -> Instant {
        let shortest = self.shortest_ttl();
        self.fences
            .iter()
            .map(|hold| {
                let span = hold
                    .ttl
                    .min(shortest)
                    .min(hold.idle.unwrap_or(Duration::MAX));
                hold.sent_at + holder_span(span)
            })
            .fold(self.bounds.deadline, Instant::max)
    }

    /// The shortest time-to-live a statement of this lease may still set: the current one, or
    /// that of a renewal whose outcome is unknown.
    fn shortest_ttl(&self) -> Duration {
        self.bounds
            .unknown_min_ttl
            .map_or(self.ttl, |unknown| unknown.min(self.ttl))
    }
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
    /// Signals changes of the lease: the end of a renewal's turn, release, loss.
    changed: Condvar,
    /// Renews this lease in the background; `None` with renewal turned off.
    renewer: Option<Weak<Renewer>>,
    settings: KeeperSettings,
    /// The registry's loss callback, if this lease reports to it (see [`Lease::report_losses`]).
    on_lost: Mutex<Option<LossSink>>,
    /// The registry's store: its table, region and client id (fenced transactions check them).
    store: Weak<dyn Store>,
    /// The registry's measures: losses, renewals, the held-leases gauge.
    pub(crate) meter: Arc<Meter>,
}

/// What one renewal found, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Renewed {
    Yes,
    NotOwner,
    Unknown,
}

/// What the lease clock does with a lease (see [`Lease::clock_look`]).
pub(super) enum ClockLook {
    /// Released, or its loss reported: the clock forgets it.
    Over,
    /// Its deadline has passed: the clock reports it lost.
    Expired,
    /// Handed to this renewer; the clock looks again at its deadline (the instant).
    Renew(Arc<Renewer>, Instant),
    /// Nothing to do until the instant.
    Later(Instant),
}

/// A renewal that holds the lease's turn; `ttl` and `version` are what it carries.
struct Turn {
    ttl: Duration,
    version: u64,
    sent_no_earlier_than: Instant,
}

/// What a lease takes from its registry.
pub(crate) struct Owner<'a> {
    /// Renews the lease in the background (unless `settings` turn renewal off).
    pub renewer: &'a Arc<Renewer>,
    pub settings: KeeperSettings,
    /// The registry's callback thread, if it has a callback.
    pub on_lost: Option<&'a LossSink>,
    pub meter: &'a Arc<Meter>,
}

impl Lease {
    /// The lease of `grant`, watched by the lease clock (which hands it to its owner's renewer
    /// when its renewal falls due).
    pub fn start(
        key: Arc<str>,
        lock_key: Arc<str>,
        grant: Grant,
        ttl: Duration,
        owner: Owner<'_>,
    ) -> Arc<Lease> {
        let Owner {
            renewer,
            settings,
            on_lost,
            meter,
        } = owner;
        let Grant { token, sent_at, .. } = grant;
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
                renewing: false,
                queued: false,
                retry_at: None,
                last_error: None,
                lost: None,
                listeners: Vec::new(),
                fences: Vec::new(),
                fence_count: 0,
            }),
            changed: Condvar::new(),
            renewer: settings.renew.then(|| Arc::downgrade(renewer)),
            settings,
            on_lost: Mutex::new(on_lost.cloned()),
            store: renewer.store(),
            meter: Arc::clone(meter),
        });
        lease.meter.held(1);
        clock::watch(&lease);
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

    /// From now on a loss of this lease goes to `sink` too (a lease started without one: a
    /// row that is not yet the user's grant). `false`, and nothing changes, when the lease is
    /// no longer held: the loss, past or coming, is not reported there.
    pub fn report_losses(&self, sink: Option<&LossSink>) -> bool {
        let state = self.state.lock();
        if Self::loss_in(&state).is_some() {
            return false;
        }
        *self.on_lost.lock() = sink.cloned();
        true
    }

    /// Why the lease is no longer held, or `None` while it is.
    pub fn loss(&self) -> Option<LossReason> {
        let state = self.state.lock();
        Self::loss_in(&state)
    }

    fn loss_in(state: &State) -> Option<LossReason> {
        if let Some(reason) = &state.lost {
            return Some(reason.clone());
        }
        (Instant::now() >= state.deadline()).then(|| LossReason::Expired(state.last_error.clone()))
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

    /// The registry's store, while the registry exists.
    pub fn store(&self) -> Option<Arc<dyn Store>> {
        self.store.upgrade()
    }

    /// How often this lease is renewed (see `RegistryBuilder::renew_every`).
    fn renew_every(&self, state: &State) -> Duration {
        let shortest = state
            .bounds
            .unknown_min_ttl
            .map_or(state.ttl, |unknown| unknown.min(state.ttl));
        self.settings.renew_every.unwrap_or(shortest / 3)
    }

    /// What the renewer needs to know about this lease when the clock hands it over at `now`:
    /// its time-to-live, when its renewal falls due, and its slack (see "Bounds" on
    /// [`Renewer`]).
    fn handover(&self, now: Instant) -> renewer::Handover {
        let state = self.state.lock();
        let period = self.renew_every(&state);
        let ttl = state
            .bounds
            .unknown_min_ttl
            .map_or(state.ttl, |unknown| unknown.min(state.ttl));
        renewer::Handover {
            ttl: state.ttl,
            due: self.renewal_due(&state, now),
            slack: renewer::SlackSeen {
                slack: ttl.saturating_sub(period).max(ttl / 20),
                period,
                seen: now,
            },
        }
    }

    /// When the next background renewal is due, looked at `now` (never after the deadline).
    fn renewal_due(&self, state: &State, now: Instant) -> Instant {
        if state.renew_now {
            return now;
        }
        let due = (state.bounds.confirmed_sent + self.renew_every(state)).min(state.deadline());
        state.retry_at.map_or(due, |retry| due.max(retry))
    }

    /// When the lease clock must look at this lease next: its deadline, or (renewing in the
    /// background, none in flight) a little before its renewal is due, so that leases due
    /// within the same window are renewed together.
    fn clock_due(&self) -> Instant {
        self.clock_due_in(&self.state.lock(), Instant::now())
    }

    fn clock_due_in(&self, state: &State, now: Instant) -> Instant {
        let deadline = state.deadline();
        if self.renewer.is_none() || state.queued || state.renewing {
            return deadline;
        }
        let early = self.renew_every(state) / 16;
        let due = self.renewal_due(state, now);
        due.checked_sub(early).unwrap_or(due).min(deadline)
    }

    /// What the lease clock does with this lease at `now` (one look, under one lock): drop it
    /// (released, or its loss reported), report it lost (its deadline passed), hand it to its
    /// renewer (its renewal falls due within the batching window: it is marked queued), or
    /// look again at the instant returned.
    fn clock_look(&self, now: Instant) -> ClockLook {
        let mut state = self.state.lock();
        if state.phase != Phase::Held || state.lost.is_some() {
            return ClockLook::Over;
        }
        if state.deadline() <= now {
            return ClockLook::Expired;
        }
        let idle = !state.queued && !state.renewing;
        if let Some(renewer) = self.renewer.as_ref().filter(|_| idle) {
            let window = self.renew_every(&state) / 8;
            if self.renewal_due(&state, now) <= now + window {
                if let Some(renewer) = renewer.upgrade() {
                    state.queued = true;
                    return ClockLook::Renew(renewer, state.deadline());
                }
            }
        }
        ClockLook::Later(self.clock_due_in(&state, now))
    }

    /// Released normally or already reported lost: nothing left to watch.
    fn is_over(&self) -> bool {
        let state = self.state.lock();
        state.phase != Phase::Held || state.lost.is_some()
    }

    /// A holder asks for `ttl` from now on (a local handoff to a thread that asked for another
    /// time-to-live): the background renewal runs with it at once. The deadline does not move
    /// until the database has the new time-to-live.
    pub fn request_ttl(&self, ttl: Duration) {
        let mut state = self.state.lock();
        if state.ttl == ttl {
            return;
        }
        state.ttl = ttl;
        state.ttl_version += 1;
        state.renew_now = true;
        let queued = state.queued;
        drop(state);
        if queued {
            // Handed over already: sent as soon as a worker is free, not when it fell due.
            if let Some(renewer) = self.renewer.as_ref().and_then(Weak::upgrade) {
                renewer.expedite(self);
            }
        }
        clock::hurry(Instant::now());
    }

    /// Takes the lease's turn (waiting until `deadline` at most, or not at all with `None`);
    /// `ttl` replaces the lease's time-to-live for this and later renewals.
    fn take_turn(&self, ttl: Option<Duration>, deadline: Option<Instant>) -> Option<Turn> {
        let mut state = self.state.lock();
        if state.renewing {
            let deadline = deadline?;
            fail_point!("lease::renew_waits_for_turn");
            while state.renewing {
                if self.changed.wait_until(&mut state, deadline).timed_out() && state.renewing {
                    return None;
                }
            }
        }
        if let Some(ttl) = ttl.filter(|ttl| *ttl != state.ttl) {
            state.ttl = ttl;
            state.ttl_version += 1;
        }
        state.renewing = true;
        let turn = Turn {
            ttl: state.ttl,
            version: state.ttl_version,
            sent_no_earlier_than: Instant::now(),
        };
        let before = state.deadline();
        state.bounds.sending(turn.sent_no_earlier_than, turn.ttl);
        let deadline = state.deadline();
        drop(state);
        if deadline < before {
            clock::hurry(deadline);
        }
        Some(turn)
    }

    /// Records what a renewal of `turn` found, ends the turn, and reports a loss it found.
    /// `outcome`: `Ok(Some(sent_at))` renewed, `Ok(None)` not the holder, `Err` unknown (the
    /// error's text). An answer that comes once the deadline has passed changes nothing: the
    /// lease ended at its deadline (whoever noticed), and it is reported lost now.
    fn end_turn(&self, turn: &Turn, outcome: Result<Option<Instant>, String>) -> Renewed {
        let now = Instant::now();
        let mut state = self.state.lock();
        state.renewing = false;
        state.queued = false;
        let releasing = state.phase != Phase::Held;
        let earlier_deadline = state.deadline();
        let passed = now >= earlier_deadline;
        if state.ttl_version == turn.version {
            state.renew_now = false;
        }
        let renewed = match outcome {
            Ok(Some(_)) if passed => {
                state.last_error = Some("a renewal was confirmed only after the deadline".into());
                Renewed::Unknown
            }
            Ok(Some(sent_at)) => {
                state.bounds.confirmed(sent_at, turn.ttl);
                state.retry_at = None;
                state.last_error = None;
                Renewed::Yes
            }
            Ok(None) => Renewed::NotOwner,
            Err(error) => {
                state.bounds.unknown(turn.sent_no_earlier_than, turn.ttl);
                let pause = self.renew_every(&state) / 4;
                state.retry_at = Some(now + pause);
                state.last_error = Some(error);
                Renewed::Unknown
            }
        };
        let next = if state.deadline() < earlier_deadline {
            state.deadline()
        } else {
            self.clock_due_in(&state, now)
        };
        drop(state);
        self.changed.notify_all();
        clock::hurry(next);
        if renewed == Renewed::NotOwner && !releasing {
            self.found_not_owner();
        } else if passed && !releasing {
            self.check();
        }
        renewed
    }

    /// Ends the turn of a background renewal that sends no statement: the lease's deadline
    /// passed before it could be sent, and it is reported lost now.
    fn end_turn_unsent(&self) {
        let releasing = {
            let mut state = self.state.lock();
            state.renewing = false;
            state.queued = false;
            state.phase != Phase::Held
        };
        self.changed.notify_all();
        if !releasing {
            self.check();
        }
    }

    /// Reports the loss of a lease whose deadline has passed (unless it is being released,
    /// or already reported); `true` if the lease is over (lost or no longer held).
    fn over_or_lost(&self) -> bool {
        let passed = {
            let state = self.state.lock();
            if state.phase != Phase::Held || state.lost.is_some() {
                return true;
            }
            Instant::now() >= state.deadline()
        };
        if passed {
            self.check();
        }
        passed
    }

    /// A fenced transaction of this lease passed its check, sent at `sent_at` with `ttl`, and
    /// the server ends it no sooner than `idle` after (`None`: never by itself): until it
    /// ends, the lease holds at least until then (see "Fenced transactions"). Returns its
    /// number for [`fence_ended`](Self::fence_ended).
    pub(crate) fn fence_opened(
        &self,
        sent_at: Instant,
        ttl: Duration,
        idle: Option<Duration>,
    ) -> u64 {
        let mut state = self.state.lock();
        state.fence_count += 1;
        let id = state.fence_count;
        state.fences.push(FenceHold {
            id,
            sent_at,
            ttl,
            idle,
            thread: std::thread::current().id(),
        });
        let due = self.clock_due_in(&state, Instant::now());
        drop(state);
        clock::hurry(due);
        id
    }

    /// Whether the calling thread has a fenced transaction of this lease open.
    pub(crate) fn fenced_here(&self) -> bool {
        let me = std::thread::current().id();
        self.state
            .lock()
            .fences
            .iter()
            .any(|hold| hold.thread == me)
    }

    /// The fenced transaction `id` ended: committed (`true`), its check's expiry stands in the
    /// row and the deadline keeps it; otherwise the row is as before it, and so is the
    /// deadline. Nothing changes for a lease already lost.
    pub(crate) fn fence_ended(&self, id: u64, committed: bool) {
        let mut state = self.state.lock();
        let Some(at) = state.fences.iter().position(|hold| hold.id == id) else {
            return;
        };
        let held = Self::loss_in(&state).is_none();
        let hold = state.fences.remove(at);
        if committed && held && !hold.ttl.is_zero() {
            let ttl = hold.ttl.min(state.shortest_ttl());
            state.bounds.fence_committed(hold.sent_at, ttl);
        }
        let due = self.clock_due_in(&state, Instant::now());
        drop(state);
        self.changed.notify_all();
        clock::hurry(due);
    }

    /// Renews now with `ttl` (a manual renewal on the main path), waiting for a background
    /// renewal in flight until `deadline`, and records what may have happened. Refused at once
    /// while a fenced transaction of this lease is open: it holds the row the renewal would
    /// wait for.
    pub fn renew(&self, store: &dyn Store, ttl: Duration, deadline: Instant) -> Renewal {
        if !self.state.lock().fences.is_empty() {
            return Renewal::Failed(Error::setting(
                "renew",
                "this lease's own fenced transaction holds its row until it ends: renew before \
                 fencing, or after the fenced transaction commits or rolls back",
            ));
        }
        let started = Instant::now();
        let Some(turn) = self.take_turn(Some(ttl), Some(deadline)) else {
            return Renewal::Failed(Error::Timeout {
                operation: "renew",
                waited: started.elapsed(),
                source: Some("another renewal of this lease was still running".into()),
            });
        };
        fail_point!("lease::renew_before_statement");
        let sent = Instant::now();
        let outcome = store.renew(&self.lock_key, self.token, turn.ttl, deadline, Path::Main);
        let renewed = u64::from(matches!(outcome, Ok(Some(_))));
        let failed = u64::from(outcome.is_err());
        self.meter.renewal(sent.elapsed(), renewed, failed);
        fail_point!("lease::renew_before_record");
        match outcome {
            Ok(renewed) => match self.end_turn(&turn, Ok(renewed)) {
                Renewed::Yes => Renewal::Renewed,
                _ => Renewal::NotOwner,
            },
            Err(e) => {
                self.end_turn(&turn, Err(e.to_string()));
                Renewal::Failed(e)
            }
        }
    }

    /// A statement found that the database records another holder or none: marks the lease lost
    /// and returns why. The reason is [`LossReason::NotOwner`] only while the deadline has not
    /// passed; past it the lease had already ended by its deadline ([`LossReason::Expired`]),
    /// whether or not the lease clock got round to saying so, and another instance's grant after
    /// that deadline is a normal one. So `NotOwner` always means the row was taken or deleted
    /// while this holder's deadline still ran (an operator, a foreign client, a clock fault),
    /// never merely "renewed too late", and the reason does not depend on which thread noticed
    /// first.
    pub fn found_not_owner(&self) -> LossReason {
        let reason = {
            let state = self.state.lock();
            Self::loss_in(&state).unwrap_or(LossReason::NotOwner)
        };
        self.mark_lost(reason.clone());
        self.loss().unwrap_or(reason)
    }

    /// Marks the lease lost (once, and not after a normal release) and tells the current
    /// holder's listeners and the callback.
    pub fn mark_lost(&self, reason: LossReason) {
        // The callback as it is when the loss is recorded (see `report_losses`).
        let (listeners, sink) = {
            let mut state = self.state.lock();
            if state.lost.is_some() || state.phase == Phase::Released {
                return;
            }
            state.lost = Some(reason.clone());
            let sink = self.on_lost.lock().clone();
            (std::mem::take(&mut state.listeners), sink)
        };
        self.changed.notify_all();
        self.meter.lost(&self.key, &reason);
        self.meter.held(-1);
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
        // The callback runs on the registry's callback thread: never here, where the lease
        // clock or a renewal worker may be reporting other leases' losses.
        if let Some(sink) = sink {
            let _ = sink.send(event);
        }
    }

    /// A channel that receives one [`LeaseLost`] if the lease is lost (at once if it already is).
    /// It is disconnected without a message when the current holder's hold ends normally.
    pub fn loss_channel(&self) -> Receiver<LeaseLost> {
        fail_point!("lease::loss_channel");
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.add_loss_listener(tx);
        rx
    }

    /// Sends one [`LeaseLost`] through `tx` if the lease is lost (at once if it already is);
    /// `tx` goes when the lease ends normally. A full channel takes no second message (a lock
    /// set hands one sender to each of its leases).
    pub(crate) fn add_loss_listener(&self, tx: Sender<LeaseLost>) {
        {
            let mut state = self.state.lock();
            match &state.lost {
                Some(reason) => {
                    let _ = tx.try_send(self.event(reason.clone()));
                    return;
                }
                None if state.phase == Phase::Released => return,
                None => state.listeners.push(tx),
            }
        }
        self.check();
    }

    /// The lock passed to another local thread: the previous holder's loss channels disconnect.
    pub fn handed_over(&self) {
        self.state.lock().listeners.clear();
    }

    /// The last holder lets go: background renewal stops, and a loss found from here on (other
    /// than by the release itself) is not reported. A deadline already passed is reported now.
    pub fn begin_release(&self) {
        self.check();
        self.state.lock().phase = Phase::Releasing;
        self.changed.notify_all();
    }

    /// The release is over: nothing is reported from now on. Returns the loss, if one was
    /// reported; the current holder's loss channels disconnect otherwise.
    pub fn end(&self) -> Option<LossReason> {
        let mut state = self.state.lock();
        if state.phase != Phase::Released && state.lost.is_none() {
            self.meter.held(-1);
        }
        state.phase = Phase::Released;
        state.listeners.clear();
        let lost = state.lost.clone();
        drop(state);
        self.changed.notify_all();
        lost
    }

    fn event(&self, reason: LossReason) -> LeaseLost {
        LeaseLost {
            key: self.key.to_string(),
            fencing_token: self.token as u64,
            reason,
        }
    }
}

mod clock;
mod renewer;

pub(crate) use renewer::Renewer;
