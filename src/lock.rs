//! One key inside one registry: the local queue, the instant handoff, and the RAII guard.
//!
//! # Local state machine
//!
//! Each [`Lock`] handle points at one `LockInner` per (registry, key). Its state sits behind a
//! `parking_lot` mutex with a condition variable for local waiters:
//!
//! | owner | lease | `db_user` | meaning | what a thread that wants the lock does |
//! |-------|-------|-----------|---------|----------------------------------------|
//! | none | none | none | free here | becomes the *poller*: sets `db_user`, runs **acquire** |
//! | none | none | a thread | another thread is polling or releasing | waits on the condvar |
//! | thread T | some | – | T holds it | T: reentrant (depth + 1); others queue and wait |
//! | none | some (`lingering`) | none | released here, still held on the database | takes it at once: no statement (see **Linger**) |
//!
//! Invariant: a lease is present exactly when an owner is, or while it lingers — a grant sets
//! both, and a release moves ownership to the next queued thread, starts a linger (owner
//! cleared, lease kept), or clears both.
//!
//! Every thread inside an acquire of the key sits in a FIFO `queue`. Only the poller talks to
//! the database for this key, so N waiting threads cost one statement per
//! `idle_between_tries`, not N. Between polls the poller sleeps with `db_user` still set, for
//! `idle_between_tries` ± 25 % at random ([`jittered`]), so that it does not keep the phase of
//! another instance's poller with the same interval (see "Turns").
//!
//! **Handoff.** When the holder releases while threads queue, ownership passes directly to the
//! oldest of them (the owner field is set to its thread before it even wakes, so the releaser
//! cannot barge back in) and the lease stays in place: the lock changes threads without a
//! database statement. The fencing token stays the same: tokens order *database grants*, and
//! the local holders of one grant are ordered by this mutex, each having released before the
//! next took over (`local_handoff(false)` turns handoffs off for users who need a token per
//! holder). The previous holder's loss channels disconnect at the handoff. A thread that asked
//! for another time-to-live gets the lease as it is and the renewal thread renews with the new one at
//! once, so the lock call itself runs no statement and cannot fail after the grant. Handoffs are
//! bounded by `local_handoff_limit` (default 1 s since the database grant): past it the holder
//! releases to the database and local waiters hold off for one `idle_between_tries`, so other
//! instances polling at that interval get their turn — once every thread that queued before
//! the grant has had a hold of it (`owed_holds`; a turn outlasts the limit by at most one hold
//! per such thread). A grant late in a turn (one continuing another instance's, see "Turns")
//! would otherwise serve only the thread that polled: in 2 + 2 rounds with Spring instances a
//! registry's second thread was sent back at its first release three turns in a row and
//! waited 3 s while its registry held the key three times.
//!
//! **Release to the database** happens when nobody queues and the key does not linger (or the
//! limit is reached, or the lease is no longer held), and when a linger ends: the lease stops
//! its renewals, reports a deadline already passed, and the **release** statement runs with
//! `db_user` set, so no local thread polls while it is in flight.
//!
//! **Linger** (`RegistryBuilder::linger`, default 5 ms, off with zero; plain locks only, not
//! a semaphore's permits or a reader/writer lock's rows). Under contention from several
//! threads on several keys most releases find nobody queued here, so the key went back to the
//! database and the next holder — often a thread of this registry microseconds later — took
//! it from there again: a release and a grant per critical section. A *hot* key instead
//! lingers: a release with nobody queued (handoffs on, the turn not over, the lease held, no
//! `keep`) clears the owner but keeps the lease in place, `lingering` = now + `linger`, and
//! returns without a statement. A thread of this registry that comes for the key meanwhile
//! takes the lease as a local handoff (same grant and fencing token; counted in
//! `local_handoffs`) — unless the lease was lost while it lingered (the renewal thread kept
//! renewing it, but a renewal may have found another holder, or the deadline passed) or the
//! turn is over: then that thread releases it to the database first and asks like any other.
//! A key is hot when its last database grant was asked for within `linger` of this
//! registry's own release (`release_done`), by another thread than the one that let go
//! (`released_by`: a single thread locking a key in a loop keeps the plain release, its
//! statements and the row free between its holds), and no attempt of that wait was refused
//! (another instance took the key in between: a ping-pong between instances, which lingers
//! would only delay); a linger that runs out unused makes it cold, so a key taken now and then
//! is released at once, as before. Lingers are ended by the registry's
//! [`Lingerer`]: one thread per registry (started with the first linger, gone after a second
//! without one) that sleeps until the earliest linger ends and then has that key released if
//! it is still lingering (a key lingering again since is due again later), each such release on
//! a short-lived thread of its own (`leasehold-linger-end`), so that a release statement that
//! waits (a row another session holds locked, a server that stops answering; bounded by
//! `operation_timeout`) delays only its own key, never another key's linger; it holds keys by `Weak`,
//! and a key whose last handle goes (the registry and its `Lock`s dropped) releases a
//! lingering lease in its `Drop`. A release run for a linger's end has no caller: a failure
//! is logged and the row runs out after its time-to-live; a loss it finds is reported through
//! the lease (callback, meter). **Fairness**: a linger delays other instances by at most
//! `linger`, and a re-take from it continues the turn (a hold, counted against
//! `local_handoff_limit`) and marks the turn contended, since another instance may be waiting
//! without this registry knowing (a refused poll writes nothing): a turn kept going by lingers
//! ends with the turn window, like one with local waiters.
//!
//! **Turns** (fairness between instances, `RegistryBuilder::turn_window`). A registry's *turn*
//! with a key is the time it keeps the key busy without a break long enough for others to
//! notice: from a grant, through local handoffs and through grants taken again within the turn
//! gap (the larger of `turn_window` and 2 × `idle_between_tries`) after its own release, and,
//! on PostgreSQL and SQLite, continuing the turn of the instance whose release woke it (the
//! notification, or the release board, carries the turn's age). When a turn reaches `local_handoff_limit` and was
//! contended (a local thread queued, this registry had waited, or it continued another
//! instance's turn) and had more than one hold, the release ends it: it does not notify, and
//! every thread of the registry stays away from the key for `turn_window`, and the release
//! statement reserves the row for the first half of it ([`Turn::Ends`]: `CREATED_DATE` set to
//! the reservation's end, which leasehold's grant waits for and Spring's ignores), so a poller
//! that is not leasehold — Spring's — takes it first, and other leasehold instances after that.
//! The registry comes back sooner once another instance has had the key: a release reported
//! while it stays away (its threads waiting then listen for releases) whose turn began after
//! the registry's own quiet release ends the staying away, and the waiter that comes back
//! continues that turn. Spring's releases report nothing, so the instances that only poll
//! keep their half of the window.
//! A single long hold (a leader's term) releases normally. While instances that only poll are
//! known to take turns too, turns last one `idle_between_tries` (at most
//! `local_handoff_limit`): for [`POLLERS_REMEMBERED`] after a grant of this lock had to insert
//! the row although this registry had released it, or although an attempt of the same wait
//! had found it held (leasehold keeps released rows; only an instance that deletes its row on
//! unlock, Spring's, can have removed it meanwhile), which the grant statement reports
//! (PostgreSQL's second column, MySQL's affected rows: 1 for an insert, 2 for the update of
//! an expired row). A turn begun by a grant that inserted the row without either sign (a new
//! key, or a row deleted while nobody here looked: the start of a round, when nothing is known
//! yet about who else waits) is as short, that turn only (`turn_found_no_row`); on the row
//! leasehold keeps, later turns have the full limit again unless pollers show themselves.
//! A short turn stays short when another leasehold instance continues it: its releases
//! report the turn's age plus the part of `local_handoff_limit` a short turn does not have
//! ([`LockInner::reported_age`]), so the instance that continues it — whose own grant found
//! the row leasehold keeps, no sign of pollers — ends it when the short turn would have
//! ended. (Before, that instance kept the key for its whole limit: at the start of 2 + 2
//! rounds with Spring instances on PostgreSQL, a Spring instance waited up to 3.6 s.)
//! Why one poll interval: a polling instance that just had the key (Spring's, whose
//! `idleBetweenTries` is 100 ms like the default) was refused right after its unlock, when a
//! leasehold waiter took the key, and polls next about one interval later; a turn of one
//! interval ends, and reserves the row, just before that poll, so that another polling
//! instance that waits — whose polls fall anywhere in the interval — usually comes first.
//! With a quarter of the limit (250 ms by default; the rule before) the instance that had the
//! key polled early in the next reservation, won it again more often than not, and another
//! Spring instance waited up to 3.4 s in 2 + 2 rounds on MariaDB (issue 25's goal 4: 2.5 s);
//! with one interval, 1.9 s (README, *Guarantees*, "Fairness").
//! A refused attempt of a Spring instance cannot be seen (its `UPDATE` matches nothing and its
//! `INSERT` fails on the duplicate key: nothing is written). Pollers of one interval — a
//! waiter here and another instance's, Spring's included, whose `idleBetweenTries` is 100 ms
//! like the default — would keep the phase they start with, and one a few milliseconds behind
//! another would find every release taken first for as long as both wait (seen on MariaDB: a
//! waiter polling 1–10 ms after a Spring instance 17 times in a row); a poller's sleep is
//! therefore spread ±25 %. While polling instances take turns (the same sign as for the
//! shorter turns), a waiter whose wake-ups cannot see their releases polls four times as
//! often ([`LockInner::poll_interval`]): a Spring unlock deletes the row, notifies nobody, and
//! the same instance inserts it again a few milliseconds later for its next lock, so only an
//! attempt in between gets the key. MySQL's watchers read such a row every few milliseconds
//! and report the delete (`backend::mysql::wakeups`); PostgreSQL's listener hears only
//! leasehold's own releases. Every other release stores the
//! turn's age in the row ([`Turn::Continues`]: `EXPIRED_AFTER` = the epoch + the age,
//! `CREATED_DATE` = now), which MySQL's woken watcher reads back. A release reported to a
//! waiting thread continues a turn only if it came during that thread's wait.
//!
//! **Unwinding.** A panic inside an acquire or a release (a bug, or a fail point in tests)
//! leaves the state as if the call had returned: the thread leaves the queue, stops being the
//! key's database user, and a grant it had is handed on or released.

use crate::backend::Turn;
use crate::error::{Error, LossReason, Result};
use crate::lease::{Lease, LeaseLost, Owner, Renewal};
use crate::registry::{Core, Settings};
use crate::wakeups::Nudge;
use crossbeam_channel::Receiver;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// How long an acquire may wait for the lock.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// One attempt; `None` if the lock is held or being acquired by another local thread.
    No,
    /// One attempt as with `No`, its statement bounded by the instant rather than by
    /// `operation_timeout` (a semaphore's round over its permits).
    Once(Instant),
    /// Until the instant.
    Until(Instant),
    /// Until granted.
    Forever,
}

struct LocalState {
    owner: Option<ThreadId>,
    depth: u32,
    lease: Option<Arc<Lease>>,
    /// Threads inside an acquire of this key, oldest first: a release hands over to the front.
    queue: VecDeque<ThreadId>,
    /// The thread talking to the database about this key (polling or releasing), if any.
    db_user: Option<ThreadId>,
    /// When this registry's current turn with the key began: its database grant, or an earlier
    /// one if it re-took the key quickly after releasing it (see "Turns" in the module docs).
    chain_started: Instant,
    /// How many holds the current turn has had, counting one for another instance's turn it
    /// continues: a turn of a single hold, however long, does not end quietly.
    holds_in_turn: u32,
    /// Whether anyone else wanted the key during this turn: a local thread queued, this
    /// registry had to wait for it, or the turn continues another instance's.
    turn_contended: bool,
    /// When this registry last released the key to the database.
    last_released: Option<Instant>,
    /// When a grant last had to insert the key's row after this registry had released it
    /// (leasehold keeps released rows, Spring Integration deletes them): an instance that only
    /// polls is taking turns too, and turns are shortened for a while (see "Turns").
    pollers_seen: Option<Instant>,
    /// A grant of the current turn had to insert the row (a new key, or a row deleted by an
    /// instance that deletes on unlock while nobody here looked): the turn is a short one,
    /// since polling instances may be waiting (see "Turns").
    turn_found_no_row: bool,
    /// How many of the threads that queued here before the current turn's grant have not had
    /// a hold of it yet: the turn is not over before they have (see "Turns").
    owed_holds: u32,
    yield_until: Option<Instant>,
    /// Set by the release listener: the poller should try again now.
    nudged: bool,
    /// From the last release notification: when it arrived, and how long the key had been busy
    /// without a break (another instance's turn, which a grant right after it continues).
    inherited_turn: Option<(Instant, Duration)>,
    /// When an acquire statement for this key last found it held elsewhere. A waiter that took
    /// over polling from another thread knows from it that the lock was held during its wait.
    refused_at: Option<Instant>,
    /// When this registry's last release statement of the key answered.
    release_done: Option<Instant>,
    /// The thread whose unlock last let go of the key.
    released_by: Option<ThreadId>,
    /// The key is hot: its last database grant was asked for within `linger` of this
    /// registry's own release, so a release nobody queues on lingers (see "Linger").
    hot: bool,
    /// Set while the lease lingers (no owner, `lease` kept): when the linger ends.
    lingering: Option<Instant>,
    /// The registry's [`Lingerer`] has an entry for this key.
    linger_queued: bool,
}

/// `idle` spread over ±25 % at random: the sleep of a poller between attempts. Pollers with
/// one interval — this registry's beside another instance's, or Spring Integration's, whose
/// `idleBetweenTries` is 100 ms like leasehold's default — would otherwise keep the phase they
/// happen to start with: one that polls a few milliseconds after another finds every release
/// taken by it first, for as long as both wait.
pub(crate) fn jittered(idle: Duration) -> Duration {
    use std::cell::Cell;
    use std::hash::BuildHasher;
    thread_local! {
        static STATE: Cell<u64> = Cell::new(
            std::collections::hash_map::RandomState::new().hash_one(std::thread::current().id())
                | 1,
        );
    }
    // xorshift64: a fraction in [0, 1) from its top 53 bits.
    let bits = STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        x
    });
    let fraction = (bits >> 11) as f64 / (1u64 << 53) as f64;
    idle.mul_f64(0.75 + 0.5 * fraction)
}

/// How long turns stay short after a grant found the row deleted by a polling instance.
pub(crate) const POLLERS_REMEMBERED: Duration = Duration::from_secs(10);

/// Shared state of one key in one registry.
pub(crate) struct LockInner {
    key: Arc<str>,
    lock_key: Arc<str>,
    core: Arc<Core>,
    state: Mutex<LocalState>,
    changed: Condvar,
    /// Whether a release may linger: a plain lock's key (not a semaphore's permit or a side of
    /// a reader/writer lock, whose rows other code reasons about).
    may_linger: bool,
}

impl LockInner {
    pub fn new(key: &str, core: Arc<Core>) -> Self {
        let mut inner = Self::with_lock_key(key, crate::key::lock_key_for(key), core);
        inner.may_linger = true;
        inner
    }

    /// A key whose row is `lock_key` rather than the key's UUID (a semaphore's permit).
    pub fn with_lock_key(key: &str, lock_key: String, core: Arc<Core>) -> Self {
        LockInner {
            key: key.into(),
            lock_key: lock_key.into(),
            core,
            state: Mutex::new(LocalState {
                owner: None,
                depth: 0,
                lease: None,
                queue: VecDeque::new(),
                db_user: None,
                chain_started: Instant::now(),
                last_released: None,
                pollers_seen: None,
                turn_found_no_row: false,
                owed_holds: 0,
                holds_in_turn: 0,
                turn_contended: false,
                yield_until: None,
                refused_at: None,
                nudged: false,
                inherited_turn: None,
                release_done: None,
                released_by: None,
                hot: false,
                lingering: None,
                linger_queued: false,
            }),
            changed: Condvar::new(),
            may_linger: false,
        }
    }

    /// `true` while no thread holds, waits for, or talks to the database about this key: the
    /// cache may then drop it.
    pub fn is_idle(&self) -> bool {
        let state = self.state.lock();
        state.owner.is_none()
            && state.lease.is_none()
            && state.queue.is_empty()
            && state.db_user.is_none()
    }

    fn acquire(self: &Arc<Self>, wait: Wait, ttl: Duration) -> Result<Option<LockGuard>> {
        self.core.settings.check_ttl("time_to_live", ttl)?;
        let called = Instant::now();
        let me = std::thread::current().id();
        let mut state = self.state.lock();
        if state.owner == Some(me) {
            let lease = state.lease.clone().expect("an owner always has a lease");
            if let Some(reason) = lease.check() {
                return Err(self.lost(reason));
            }
            state.depth += 1;
            return Ok(Some(self.guard(lease)));
        }
        state.queue.push_back(me);
        let mut registered = false;
        // Unwind-safe: whatever panics inside (a bug, a fail point), this thread leaves the
        // queue, stops being the poller, and a grant it got is handed on or released.
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
            self.acquire_locked(&mut state, me, wait, ttl, &mut registered)
        }));
        if registered {
            self.core
                .wakeups
                .unregister(&self.lock_key, &self.as_poller());
        }
        if let Some(position) = state.queue.iter().position(|waiter| *waiter == me) {
            state.queue.remove(position);
        }
        if state.db_user == Some(me) {
            state.db_user = None;
        }
        // Needed when this thread leaves without the lock (another waiter may have to poll).
        // Leaving with it, the wake-up looks useless, but the waiters it wakes are awake when
        // the lock is handed on: skipping it made `local_handoff/leasehold_4_threads` 30 %
        // slower.
        self.changed.notify_all();
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(panic) => {
                let orphan = state.lease.clone().filter(|_| state.owner == Some(me));
                drop(state);
                drop(orphan.map(|lease| self.guard(lease)));
                panic::resume_unwind(panic);
            }
        };
        drop(state);
        let (lease, retune, handed_over) = match outcome? {
            Some(taken) => taken,
            None => return Ok(None),
        };
        // One clock read for both: the wait's end is the hold's start.
        let granted_at = Instant::now();
        self.core.meter.granted(
            &self.key,
            handed_over,
            granted_at.saturating_duration_since(called),
        );
        if retune {
            // Handed over from a holder with another time-to-live: the renewal thread renews with this
            // one at once; the call itself runs no statement and cannot fail.
            lease.request_ttl(ttl);
        }
        let mut guard = self.guard(lease);
        guard.held_since = Some(granted_at);
        Ok(Some(guard))
    }

    /// The waiting loop; returns the lease taken, whether it must be renewed with the
    /// requested time-to-live (a handed-over lease runs with its granter's), and whether it was
    /// handed over locally (rather than granted by this thread's statement).
    fn acquire_locked(
        self: &Arc<Self>,
        state: &mut MutexGuard<'_, LocalState>,
        me: ThreadId,
        wait: Wait,
        ttl: Duration,
        registered: &mut bool,
    ) -> Result<Option<(Arc<Lease>, bool, bool)>> {
        let settings = &self.core.settings;
        let waiting_since = Instant::now();
        // The first pass reads no clock again: it is the start of the wait.
        let mut first_pass = Some(waiting_since);
        // Whether this wait's step aside (after this registry's turn end) was cut short.
        let mut came_back = false;
        loop {
            let now = first_pass.take().unwrap_or_else(Instant::now);
            if state.owner == Some(me) {
                let lease = state.lease.clone().expect("an owner always has a lease");
                let retune = lease.ttl() != ttl;
                return Ok(Some((lease, retune, true)));
            }
            if state.owner.is_none() {
                if let Some(lease) = state.lease.clone() {
                    debug_assert!(state.lingering.is_some(), "an ownerless lease lingers");
                    let turn_over = Self::turn_limit(settings, state, now)
                        .is_some_and(|limit| now.duration_since(state.chain_started) >= limit);
                    // A lease lost while it lingered (its deadline passed, a renewal found
                    // another holder) is never handed on: it is released and this thread
                    // asks the database like any other.
                    if !turn_over && lease.check().is_none() {
                        state.lingering = None;
                        state.owner = Some(me);
                        state.depth = 1;
                        state.holds_in_turn += 1;
                        // Other instances may be waiting without this registry knowing (a
                        // refused poll writes nothing): a turn kept going by lingers ends
                        // with the turn window, as one with local waiters does.
                        state.turn_contended = true;
                        let retune = lease.ttl() != ttl;
                        return Ok(Some((lease, retune, true)));
                    }
                    self.end_linger(state);
                    continue;
                }
                // The step aside after a turn end is over early once another instance has had
                // the key since: a release of a turn that began after this registry's quiet
                // one was reported (see "Turns").
                if state.yield_until.is_some_and(|until| until > now)
                    && Self::another_turn_since_ours(state)
                {
                    state.yield_until = None;
                    came_back = true;
                }
                let yielding = state.yield_until.filter(|until| *until > now);
                if state.db_user.is_none() && yielding.is_none() {
                    let attempt_deadline = match wait {
                        Wait::Until(deadline) | Wait::Once(deadline) => {
                            deadline.max(now + Duration::from_millis(1))
                        }
                        _ => now + settings.operation_timeout,
                    };
                    if !matches!(wait, Wait::No | Wait::Once(_)) {
                        *registered |= self.core.wakeups.register(&self.lock_key, self.as_poller());
                    }
                    // A release notified from here on cuts the sleep after a failed attempt
                    // short, even one that arrives while the attempt is in flight.
                    state.nudged = false;
                    state.db_user = Some(me);
                    let asked = now;
                    let granted = MutexGuard::unlocked(state, || {
                        fail_point!("lock::acquire_before_statement");
                        self.core
                            .store
                            .acquire(&self.lock_key, &self.key, ttl, attempt_deadline)
                    });
                    state.db_user = None;
                    // When the answer came: the grant's usability and the turn are judged by it.
                    let arrived = Instant::now();
                    // An attempt of this wait (this thread's, or that of the poller it took over
                    // from) found the lock held.
                    let seen_held = state.refused_at.is_some_and(|at| at >= waiting_since);
                    let granted = match granted {
                        // The lock was held at the last attempt and the caller's time ran out
                        // on this one (often waiting for a pooled connection): still "held".
                        Err(Error::Timeout { .. })
                            if seen_held && matches!(wait, Wait::Until(_)) =>
                        {
                            return Ok(None)
                        }
                        other => other?,
                    };
                    match granted {
                        // The statement waited so long (a row lock, a stalled server) that the
                        // lease would be over on arrival: not a usable grant; it runs out.
                        Some(grant) if Lease::grant_deadline(grant.sent_at, ttl) <= arrived => {
                            log::warn!(
                                "the grant of {:?} arrived after its time-to-live ({ttl:?}) ran \
                                 out; trying again",
                                self.key
                            );
                            if matches!(wait, Wait::No | Wait::Once(_)) {
                                return Ok(None);
                            }
                            continue;
                        }
                        Some(grant) => {
                            // An attempt of this wait found the key held.
                            let waited = state.refused_at.is_some_and(|at| at >= waiting_since);
                            // The row was gone although this registry had released it (it
                            // keeps released rows) or an attempt of this wait found it held:
                            // an instance that deletes its row on unlock (Spring) held the key
                            // meanwhile.
                            if grant.inserted && (state.last_released.is_some() || waited) {
                                state.pollers_seen = Some(Instant::now());
                            }
                            let lease = Lease::start(
                                Arc::clone(&self.key),
                                Arc::clone(&self.lock_key),
                                grant,
                                ttl,
                                Owner {
                                    renewer: &self.core.renewer,
                                    settings: settings.keeper,
                                    on_lost: self.core.on_lost.as_ref(),
                                    meter: &self.core.meter,
                                },
                            );
                            state.lease = Some(Arc::clone(&lease));
                            state.owner = Some(me);
                            state.depth = 1;
                            let now = arrived;
                            // Coming back from a step aside cut short by another instance's
                            // release is a wait for a key held elsewhere too.
                            let waited = came_back || waited;
                            let gap = settings.turn_gap();
                            // A quick re-grant continues this registry's turn, unless that turn
                            // is already over: it was not ended at the release (nobody queued
                            // here, so it looked uncontended), but other instances may have
                            // held the key in between and continued it, and would end it at
                            // every release of theirs if it went on growing.
                            let turn_over =
                                Self::turn_limit(settings, state, now).is_some_and(|limit| {
                                    now.duration_since(state.chain_started) >= limit
                                });
                            let resumed = !turn_over
                                && state
                                    .last_released
                                    .is_some_and(|at| now.duration_since(at) < gap);
                            // Only a release seen during this wait continues a turn: one
                            // reported while nobody here waited (a watcher still running, a
                            // notification for another thread) is older than this wait.
                            let inherited = state
                                .inherited_turn
                                .take()
                                .filter(|(at, _)| *at >= waiting_since)
                                .filter(|(at, _)| now.duration_since(*at) < gap)
                                .and_then(|(at, age)| at.checked_sub(age));
                            if let Some(started) = inherited.filter(|_| waited) {
                                state.chain_started = started;
                                state.holds_in_turn = 2;
                                state.turn_contended = true;
                                state.turn_found_no_row = grant.inserted;
                            } else if waited || !resumed {
                                state.chain_started = now;
                                state.holds_in_turn = 1;
                                state.turn_contended = waited;
                                state.turn_found_no_row = grant.inserted;
                            } else {
                                state.holds_in_turn += 1;
                                state.turn_found_no_row |= grant.inserted;
                            }
                            state.yield_until = None;
                            // Every other thread queued now gets a hold of this turn.
                            state.owed_holds = (state.queue.len() as u32).saturating_sub(1);
                            // Asked for within `linger` of this registry's own release by
                            // another thread than the one that let go (a single thread locking
                            // in a loop keeps the plain release), and not refused meanwhile
                            // (another instance held it in between, as in a ping-pong between
                            // instances, which a linger would only slow down): the key is hot,
                            // and its next release without local waiters lingers.
                            state.hot = !waited
                                && state.released_by != Some(me)
                                && state.release_done.is_some_and(|done| {
                                    asked.saturating_duration_since(done) < settings.linger
                                });
                            return Ok(Some((lease, false, false)));
                        }
                        None => {
                            state.refused_at = Some(Instant::now());
                            self.core.meter.contended(&self.key);
                            let next_poll = Instant::now() + jittered(self.poll_interval(state));
                            let wake_at = match wait {
                                Wait::No | Wait::Once(_) => return Ok(None),
                                Wait::Until(deadline) if deadline <= Instant::now() => {
                                    return Ok(None)
                                }
                                Wait::Until(deadline) => next_poll.min(deadline),
                                Wait::Forever => next_poll,
                            };
                            state.db_user = Some(me);
                            self.sleep_between_polls(state, wake_at);
                            state.db_user = None;
                            continue;
                        }
                    }
                }
            }
            match wait {
                Wait::No | Wait::Once(_) => return Ok(None),
                Wait::Until(deadline) if deadline <= now => return Ok(None),
                Wait::Until(deadline) => {
                    let until = state
                        .yield_until
                        .filter(|y| *y > now)
                        .map_or(deadline, |y| y.min(deadline));
                    self.hear_releases_while_stepping_aside(state, now, registered);
                    self.changed.wait_until(state, until);
                }
                Wait::Forever => match state.yield_until.filter(|y| *y > now) {
                    Some(until) => {
                        self.hear_releases_while_stepping_aside(state, now, registered);
                        self.changed.wait_until(state, until);
                    }
                    None => self.changed.wait(state),
                },
            }
        }
    }

    /// Whether a release was reported (since this registry's own last release) whose turn
    /// began after that release: another instance has had the key since this registry let
    /// go. A quiet release (a turn end) reports no turn, so this registry's own does not count.
    fn another_turn_since_ours(state: &LocalState) -> bool {
        let (Some((heard, age)), Some(ours)) = (state.inherited_turn, state.last_released) else {
            return false;
        };
        heard.checked_sub(age).is_some_and(|began| began > ours)
    }

    /// A thread that waits while the registry steps aside after a turn end listens for
    /// releases, so that another instance's release ends the step aside (see "Turns").
    fn hear_releases_while_stepping_aside(
        self: &Arc<Self>,
        state: &mut MutexGuard<'_, LocalState>,
        now: Instant,
        registered: &mut bool,
    ) {
        if state.yield_until.is_some_and(|until| until > now) && state.db_user.is_none() {
            if !*registered {
                *registered = self.core.wakeups.register(&self.lock_key, self.as_poller());
            }
            if *registered {
                self.core.wakeups.before_sleep();
            }
        }
    }

    /// The poller's sleep until its next attempt; a release notification (since the attempt
    /// was sent) cuts it short.
    fn sleep_between_polls(&self, state: &mut MutexGuard<'_, LocalState>, wake_at: Instant) {
        self.core.wakeups.before_sleep();
        while Instant::now() < wake_at && !state.nudged {
            self.changed.wait_until(state, wake_at);
        }
    }

    /// This key's poller, as release notifications see it.
    fn as_poller(self: &Arc<Self>) -> Weak<dyn Nudge> {
        Arc::downgrade(self) as Weak<dyn Nudge>
    }

    /// Called by a guard whose depth reaches this thread's last hold.
    fn release(self: &Arc<Self>, lease: &Arc<Lease>) -> Result<()> {
        self.release_keeping(lease, None, true)
    }

    /// [`release`](Self::release); with `keep`, the row stays held until its grant + `keep`
    /// (see [`LockGuard::unlock_keeping_for`]) and the lease is never handed over locally;
    /// `linger`: whether the release may linger (not for a refused `unlock_keeping_for`).
    fn release_keeping(
        self: &Arc<Self>,
        lease: &Arc<Lease>,
        keep: Option<Duration>,
        linger: bool,
    ) -> Result<()> {
        let mut state = self.state.lock();
        state.depth -= 1;
        if state.depth > 0 {
            return match lease.check() {
                Some(reason) => Err(self.lost(reason)),
                None => Ok(()),
            };
        }
        state.owner = None;
        let me = std::thread::current().id();
        state.released_by = Some(me);
        let now = Instant::now();
        let settings = &self.core.settings;
        state.turn_contended |= !state.queue.is_empty();
        let turn_over = Self::turn_limit(settings, &state, now)
            .is_some_and(|limit| now.duration_since(state.chain_started) >= limit);
        // A thread queued before the turn's grant still gets its hold of a turn that is over.
        let owed = state.owed_holds > 0 && !state.queue.is_empty();
        if settings.local_handoff && (!turn_over || owed) && lease.is_held() && keep.is_none() {
            if let Some(next) = state.queue.pop_front() {
                state.owner = Some(next);
                state.depth = 1;
                state.holds_in_turn += 1;
                state.owed_holds = state.owed_holds.saturating_sub(1);
                lease.handed_over();
                self.changed.notify_all();
                return Ok(());
            }
            // Nobody queues: a hot key lingers (see "Linger" in the module docs).
            if !turn_over && linger && self.may_linger && state.hot && !settings.linger.is_zero() {
                let until = now + settings.linger;
                state.lingering = Some(until);
                lease.handed_over();
                if !state.linger_queued {
                    state.linger_queued = true;
                    self.core.lingerer.add(until, Arc::downgrade(self));
                }
                return Ok(());
            }
        }
        self.release_now(&mut state, lease, keep, me, now)
    }

    /// Releases `lease` to the database (the state is unlocked around the statement), ending
    /// the turn with the turn window if the turn is over and was contended.
    /// `me`: the calling thread; `now`: the time of the call.
    fn release_now(
        &self,
        state: &mut MutexGuard<'_, LocalState>,
        lease: &Arc<Lease>,
        keep: Option<Duration>,
        me: ThreadId,
        now: Instant,
    ) -> Result<()> {
        let settings = &self.core.settings;
        let turn_over = Self::turn_limit(settings, state, now)
            .is_some_and(|limit| now.duration_since(state.chain_started) >= limit);
        // The end of a long turn: leave the key to other instances for the turn window, without
        // waking notified waiters, so that instances that only poll get it too. Otherwise the
        // notified waiters of other instances continue this turn.
        let window = settings
            .turn_window
            .filter(|_| turn_over && state.holds_in_turn > 1 && state.turn_contended);
        if let Some(window) = window {
            state.yield_until = Some(now + window);
            self.core.meter.turn_ended(&self.key);
        }
        let turn = match window {
            Some(window) => Turn::Ends {
                reserved: window / 2,
            },
            None => Turn::Continues(Self::reported_age(settings, state, now)),
        };
        state.last_released = Some(now);
        state.lease = None;
        state.lingering = None;
        state.db_user = Some(me);
        let outcome = MutexGuard::unlocked(state, || {
            panic::catch_unwind(AssertUnwindSafe(|| {
                self.release_to_database(lease, turn, keep)
            }))
        });
        state.db_user = None;
        state.release_done = Some(Instant::now());
        self.changed.notify_all();
        outcome.unwrap_or_else(|panic| panic::resume_unwind(panic))
    }

    /// Ends a linger now (run out, or found lost or past the turn by a thread that came for
    /// the key): releases the lease to the database. Its outcome has no caller to go to: a
    /// failure is logged (a loss has been reported through the lease already).
    fn end_linger(&self, state: &mut MutexGuard<'_, LocalState>) {
        let lease = state.lease.clone().expect("a linger keeps its lease");
        let (me, now) = (std::thread::current().id(), Instant::now());
        if let Err(e) = self.release_now(state, &lease, None, me, now) {
            log::warn!("releasing {:?} after it lingered: {e}", self.key);
        }
    }

    /// The registry's [`Lingerer`] reached this key's linger: release the lease unless a thread
    /// took it, or it lingers again until later (then it is due again then).
    fn linger_due(self: &Arc<Self>) {
        let mut state = self.state.lock();
        state.linger_queued = false;
        let Some(until) = state.lingering else {
            return;
        };
        if until > Instant::now() {
            state.linger_queued = true;
            self.core.lingerer.add(until, Arc::downgrade(self));
            return;
        }
        // Nobody came: the key is cold until a quick re-grant shows otherwise.
        state.hot = false;
        self.end_linger(&mut state);
    }

    /// How long the poller sleeps between attempts (before the jitter): `idle_between_tries`,
    /// or a quarter of it (at least 1 ms) while instances that only poll take turns with the
    /// key (see "Turns") and the wake-ups cannot see their releases (every backend's but
    /// MySQL's watchers): a Spring Integration holder deletes its row on unlock, announces
    /// nothing and inserts it again for its next lock a few milliseconds later, and only an
    /// attempt in between gets the key.
    fn poll_interval(&self, state: &LocalState) -> Duration {
        let idle = self.core.settings.idle_between_tries;
        let pollers = state
            .pollers_seen
            .is_some_and(|seen| seen.elapsed() < POLLERS_REMEMBERED);
        match pollers && !self.core.wakeups.sees_rows() {
            true => (idle / 4).max(Duration::from_millis(1)).min(idle),
            false => idle,
        }
    }

    /// How long a turn may last now: `local_handoff_limit`, or `idle_between_tries` (at most
    /// the limit) for [`POLLERS_REMEMBERED`] after a grant found that an instance
    /// that deletes on unlock had held the key (see "Turns" in the module docs).
    fn turn_limit(settings: &Settings, state: &LocalState, now: Instant) -> Option<Duration> {
        let limit = settings.local_handoff_limit?;
        let pollers = state.turn_found_no_row
            || state
                .pollers_seen
                .is_some_and(|seen| now.duration_since(seen) < POLLERS_REMEMBERED);
        Some(match pollers {
            true => settings.idle_between_tries.min(limit),
            false => limit,
        })
    }

    /// The turn's age as a release reports it to the instance that may continue the turn: how
    /// long the key has been busy, plus, while this registry's turns are short (instances that
    /// only poll take part, or the turn began by inserting the row), the part of
    /// `local_handoff_limit` that a short turn does not have. An instance that continues the
    /// turn measures it against its own limit, so it ends the turn when the short turn would
    /// have ended, though its own grant found no sign of pollers (see "Turns").
    fn reported_age(settings: &Settings, state: &LocalState, now: Instant) -> Duration {
        let age = now.saturating_duration_since(state.chain_started);
        match (
            settings.local_handoff_limit,
            Self::turn_limit(settings, state, now),
        ) {
            (Some(full), Some(short)) => age.saturating_add(full.saturating_sub(short)),
            _ => age,
        }
    }

    /// The release statement (`turn`: see [`Turn`]). A
    /// loss known before it (the deadline passed) or found by it (the row has another holder) is
    /// reported through the lease, once, and returned.
    fn release_to_database(&self, lease: &Lease, turn: Turn, keep: Option<Duration>) -> Result<()> {
        lease.begin_release();
        let deadline = Instant::now() + self.core.settings.operation_timeout;
        fail_point!("lock::release_before_statement");
        let store = &self.core.store;
        let released = match keep {
            Some(keep) => store.release_keeping(&self.lock_key, lease.token, keep, deadline),
            None => store.release(&self.lock_key, lease.token, deadline, turn),
        };
        if let Ok(false) = released {
            lease.found_not_owner();
        }
        match (lease.end(), released) {
            (Some(reason), _) => Err(self.lost(reason)),
            (None, Ok(_)) => Ok(()),
            (None, Err(e)) => Err(e),
        }
    }

    fn lost(&self, reason: LossReason) -> Error {
        Error::LeaseLost {
            key: self.key.to_string(),
            reason,
        }
    }

    fn guard(self: &Arc<Self>, lease: Arc<Lease>) -> LockGuard {
        LockGuard {
            lock: Arc::clone(self),
            lease,
            released: false,
            held_since: None,
            _not_send: PhantomData,
        }
    }
}

impl Drop for LockInner {
    /// The last handle on the key went (the registry and every `Lock` of it dropped) while
    /// its lease lingered: release the row now rather than leave it to its time-to-live.
    fn drop(&mut self) {
        let state = self.state.get_mut();
        let Some(lease) = state.lease.take() else {
            return;
        };
        state.lingering = None;
        let turn = Turn::Continues(Self::reported_age(
            &self.core.settings,
            state,
            Instant::now(),
        ));
        if let Err(e) = self.release_to_database(&lease, turn, None) {
            log::warn!("releasing {:?}, which lingered, on drop: {e}", self.key);
        }
    }
}

/// Ends the lingers of one registry's locks (see "Linger" in the module docs): a queue of
/// keys by the end of their linger, and one thread, started when a key lingers and ending
/// after [`Lingerer::IDLE_TICK`] without one, that has a key whose linger ran out unused
/// released, each release on a short-lived thread of its own.
/// It holds its keys by `Weak`: a key whose last handle goes releases itself on drop.
#[derive(Default)]
pub(crate) struct Lingerer {
    queue: Mutex<LingerQueue>,
    wake: Condvar,
}

#[derive(Default)]
struct LingerQueue {
    due: std::collections::BinaryHeap<std::cmp::Reverse<Due>>,
    /// The thread is running.
    running: bool,
    /// Until when the thread sleeps (`None`: waiting for work): an entry due later than this
    /// needs no wake-up.
    sleeps_until: Option<Instant>,
    added: u64,
}

struct Due {
    at: Instant,
    order: u64,
    lock: Weak<LockInner>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

impl Lingerer {
    /// How long the thread waits without a lingering key before it ends.
    const IDLE_TICK: Duration = Duration::from_secs(1);

    /// `lock` lingers until `at`. Called with the key's state locked (the thread never locks
    /// a key's state while it holds the queue).
    fn add(self: &Arc<Self>, at: Instant, lock: Weak<LockInner>) {
        let mut queue = self.queue.lock();
        queue.added += 1;
        let order = queue.added;
        queue.due.push(std::cmp::Reverse(Due { at, order, lock }));
        if queue.running {
            if queue.sleeps_until.is_none_or(|until| at < until) {
                self.wake.notify_one();
            }
            return;
        }
        let this = Arc::clone(self);
        let started = std::thread::Builder::new()
            .name("leasehold-linger".into())
            .spawn(move || this.run());
        match started {
            Ok(_) => queue.running = true,
            // Left queued: the next linger tries to start the thread again, and a thread that
            // comes for the key ends an overdue linger itself.
            Err(e) => log::error!("could not start the thread that ends lingers: {e}"),
        }
    }

    /// Ends `lock`'s linger — usually a release statement — on a thread of its own, so that a
    /// statement that waits (a row another session holds locked, a server that stops
    /// answering; each bounded by `operation_timeout`) delays only its own key's release, never
    /// the end of another key's linger. Inline only if no thread can be started.
    fn end_on_its_own_thread(lock: Arc<LockInner>) {
        let end = |lock: Arc<LockInner>| {
            let ended = panic::catch_unwind(AssertUnwindSafe(|| lock.linger_due()));
            if ended.is_err() {
                log::error!("ending the linger of {:?} panicked", lock.key);
            }
        };
        let spare = Arc::clone(&lock);
        let started = std::thread::Builder::new()
            .name("leasehold-linger-end".into())
            .spawn(move || end(lock));
        if let Err(e) = started {
            log::warn!("could not start a thread to end a linger ({e}); ending it here");
            end(spare);
        }
    }

    fn run(self: Arc<Self>) {
        let mut queue = self.queue.lock();
        loop {
            let now = Instant::now();
            let next = queue.due.peek().map(|due| due.0.at);
            match next {
                None => {
                    queue.sleeps_until = None;
                    let idle = self.wake.wait_for(&mut queue, Self::IDLE_TICK);
                    if idle.timed_out() && queue.due.is_empty() {
                        queue.running = false;
                        return;
                    }
                }
                Some(at) if at > now => {
                    queue.sleeps_until = Some(at);
                    self.wake.wait_until(&mut queue, at);
                }
                Some(_) => {
                    let due = queue.due.pop().expect("peeked").0;
                    queue.sleeps_until = Some(now);
                    drop(queue);
                    if let Some(lock) = due.lock.upgrade() {
                        Self::end_on_its_own_thread(lock);
                    }
                    queue = self.queue.lock();
                }
            }
        }
    }
}

/// A handle on one named lock of a registry. Cheap to clone; all clones (and every later
/// [`LockRegistry::obtain`](crate::LockRegistry::obtain) of the same key while this one is in
/// use) share one local queue.
///
/// Acquiring is reentrant per thread: a thread that holds the lock and asks again gets another
/// guard at once (and the lock is released when the outermost guard goes). A nested acquire
/// keeps the lease's current time-to-live.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
/// use std::time::Duration;
/// let lock = registry.obtain("account-42")?;
/// let guard = lock.lock()?;
/// let worker = {
///     let lock = lock.clone(); // another thread of this instance queues behind us
///     std::thread::spawn(move || lock.lock().map(|guard| guard.fencing_token()))
/// };
/// let nested = lock.try_lock()?.expect("reentrant on this thread");
/// drop(nested);
/// let token = guard.fencing_token();
/// while lock.queued_threads() == 0 {
///     std::thread::yield_now(); // until the worker waits for us
/// }
/// guard.unlock()?; // handed to the worker without a statement, same grant
/// assert_eq!(worker.join().unwrap()?, token);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    inner: Arc<LockInner>,
}

impl Nudge for LockInner {
    /// Called by the release listener: the lock was released elsewhere, poll now.
    fn nudge(&self, turn_age: Duration) {
        let mut state = self.state.lock();
        state.nudged = true;
        if !turn_age.is_zero() {
            state.inherited_turn = Some((Instant::now(), turn_age));
        }
        drop(state);
        self.changed.notify_all();
    }
}

impl Lock {
    pub(crate) fn new(inner: Arc<LockInner>) -> Self {
        Lock { inner }
    }

    /// The key this lock was obtained with.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// Registers (`watch`) or unregisters `poller` for release notifications of this key, for
    /// a poller that calls `try_lock` on its own schedule (a leader election's agent). Returns
    /// whether it is registered now.
    pub(crate) fn watch_releases(&self, poller: &Weak<dyn Nudge>, watch: bool) -> bool {
        let wakeups = &self.inner.core.wakeups;
        if watch {
            return wakeups.register(&self.inner.lock_key, Weak::clone(poller));
        }
        wakeups.unregister(&self.inner.lock_key, poller);
        false
    }

    /// A watching poller found the lock held and sleeps until its next attempt.
    pub(crate) fn expect_release(&self) {
        self.inner.core.wakeups.before_sleep();
    }

    /// The `LOCK_KEY` stored in the table (see [`lock_key_for`](crate::lock_key_for)).
    pub fn lock_key(&self) -> &str {
        &self.inner.lock_key
    }

    /// How many threads of this registry are inside an acquire of this lock right now
    /// (waiting for a local holder, polling, or about to be handed the lock). For monitoring.
    pub fn queued_threads(&self) -> usize {
        self.inner.state.lock().queue.len()
    }

    /// `true` if the calling thread holds this lock through this registry.
    pub fn is_held_by_current_thread(&self) -> bool {
        self.inner.state.lock().owner == Some(std::thread::current().id())
    }

    /// Blocks until the lock is granted, with the registry's default time-to-live.
    ///
    /// Polls the database every `idle_between_tries` (± 25 %) while another instance holds the lock, and
    /// wakes at once when another thread of this registry releases it. Returns `Err` only when
    /// the database keeps failing for `operation_timeout` or refuses for good.
    pub fn lock(&self) -> Result<LockGuard> {
        self.lock_with_ttl(self.inner.core.settings.time_to_live)
    }

    /// [`lock`](Self::lock) with a time-to-live for this lease only.
    pub fn lock_with_ttl(&self, ttl: Duration) -> Result<LockGuard> {
        let guard = self.inner.acquire(Wait::Forever, ttl)?;
        Ok(guard.expect("an unbounded wait ends only with a grant or an error"))
    }

    /// Locks (waiting as [`lock`](Self::lock) does), runs `work` with the guard, unlocks, and
    /// returns what `work` returned.
    ///
    /// `Err(LeaseLost)` means `work` ran but the lease was lost before it finished: another
    /// instance may have held the lock meanwhile, so treat its effects as unprotected (its value
    /// is dropped). `work` can watch [`LockGuard::loss_channel`] or
    /// [`LockGuard::is_held`] to stop early. A panic in `work` unlocks and goes on unwinding.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// let rows = registry.obtain("nightly-export")?.with_lock(|guard| {
    ///     // ... export, passing guard.fencing_token() along with each write ...
    ///     42
    /// })?;
    /// assert_eq!(rows, 42);
    /// # Ok(()) }
    /// ```
    pub fn with_lock<T>(&self, work: impl FnOnce(&LockGuard) -> T) -> Result<T> {
        let guard = self.lock()?;
        let value = work(&guard);
        guard.unlock().map(|()| value)
    }

    /// One attempt: `Ok(None)` when the lock is held elsewhere (another instance, or another
    /// thread of this registry, or one that is acquiring it right now).
    ///
    /// The attempt retries transient failures (a server restarting, a busy file) for up to
    /// `operation_timeout` (5 s by default), so against a server that went away it blocks that
    /// long before returning [`Error::Timeout`]. For a bounded wait use
    /// [`try_lock_for`](Self::try_lock_for): a caller deadline bounds database calls too.
    pub fn try_lock(&self) -> Result<Option<LockGuard>> {
        self.try_lock_with_ttl(self.inner.core.settings.time_to_live)
    }

    /// [`try_lock`](Self::try_lock) with a time-to-live for this lease only.
    pub fn try_lock_with_ttl(&self, ttl: Duration) -> Result<Option<LockGuard>> {
        self.inner.acquire(Wait::No, ttl)
    }

    /// One attempt, like [`try_lock_with_ttl`](Self::try_lock_with_ttl), whose statement gives
    /// up at `deadline` ([`Error::Timeout`]) rather than after `operation_timeout`.
    pub(crate) fn try_lock_once_until(
        &self,
        deadline: Instant,
        ttl: Duration,
    ) -> Result<Option<LockGuard>> {
        self.inner.acquire(Wait::Once(deadline), ttl)
    }

    /// Waits at most `timeout`; `Ok(None)` if the lock was not granted in that time.
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        self.try_lock_for_with_ttl(timeout, self.inner.core.settings.time_to_live)
    }

    /// [`try_lock_for`](Self::try_lock_for) with a time-to-live for this lease only.
    pub fn try_lock_for_with_ttl(
        &self,
        timeout: Duration,
        ttl: Duration,
    ) -> Result<Option<LockGuard>> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_lock_until_with_ttl(deadline, ttl),
            None => self.lock_with_ttl(ttl).map(Some),
        }
    }

    /// Waits until `deadline`; `Ok(None)` if the lock was not granted by then. A deadline in the
    /// past makes one attempt, like [`try_lock`](Self::try_lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard>> {
        self.try_lock_until_with_ttl(deadline, self.inner.core.settings.time_to_live)
    }

    /// [`try_lock_until`](Self::try_lock_until) with a time-to-live for this lease only.
    pub fn try_lock_until_with_ttl(
        &self,
        deadline: Instant,
        ttl: Duration,
    ) -> Result<Option<LockGuard>> {
        if deadline <= Instant::now() {
            return self.inner.acquire(Wait::No, ttl);
        }
        self.inner.acquire(Wait::Until(deadline), ttl)
    }
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.inner.key)
            .field("lock_key", &self.inner.lock_key)
            .finish()
    }
}

/// Proof that the current thread holds a lock. Releases it when dropped.
///
/// Dropping releases on a best-effort basis and logs failures; call [`unlock`](Self::unlock)
/// to learn whether the lease was still held when it was released. The guard is `!Send`: a
/// lock is held by a thread, which is what makes reentrancy well defined.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
/// use leasehold::crossbeam_channel::{select, tick};
/// use std::time::Duration;
/// let guard = registry.obtain("import")?.lock()?;
/// let lost = guard.loss_channel();
/// let work = tick(Duration::from_millis(1));
/// for _batch in 0..3 {
///     select! {
///         recv(lost) -> event => return Err(leasehold::Error::LeaseLost {
///             key: guard.key().into(),
///             reason: event.expect("lost, not released").reason,
///         }),
///         recv(work) -> _ => { /* one batch, written with guard.fencing_token() */ }
///     }
/// }
/// assert!(guard.is_held() && guard.remaining() > Duration::ZERO);
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
pub struct LockGuard {
    lock: Arc<LockInner>,
    lease: Arc<Lease>,
    released: bool,
    /// When this (outermost) guard was granted; `None` for a nested one.
    held_since: Option<Instant>,
    _not_send: PhantomData<*const ()>,
}

impl LockGuard {
    /// The lease behind this guard (for the leader election).
    pub(crate) fn lease(&self) -> &Arc<Lease> {
        &self.lease
    }

    /// The key of the lock held.
    pub fn key(&self) -> &str {
        &self.lock.key
    }

    /// `true` while the lease is held: not reported lost and not past its deadline.
    pub fn is_held(&self) -> bool {
        self.lease.is_held()
    }

    /// The fencing token of the database grant behind this guard. Every grant of a key carries
    /// a larger token than all earlier grants of that key. Pass it to the resource you protect
    /// and have it refuse tokens smaller than the largest it has seen.
    ///
    /// **A local handoff keeps the token**: threads of one registry that pass the lock among
    /// themselves share their grant's token, so the rule above refuses late writes of other
    /// instances' earlier holders but not of an earlier thread of this registry (its hold ended
    /// before the next began, yet a write it started may arrive late). If the resource must
    /// tell those apart too, build the registry with
    /// [`local_handoff(false)`](crate::RegistryBuilder::local_handoff): every holder then gets
    /// its own grant and token, at the cost of a release and an acquire per handoff.
    pub fn fencing_token(&self) -> u64 {
        self.lease.token as u64
    }

    /// How long the lease is certainly still held if no renewal succeeds from now on.
    pub fn remaining(&self) -> Duration {
        self.lease
            .deadline()
            .saturating_duration_since(Instant::now())
    }

    /// A channel that receives one [`LeaseLost`] if the lease is lost (at once if it already
    /// is); it disconnects without a message when the lease ends normally. Use it with
    /// `crossbeam_channel::select!` to stop work promptly.
    pub fn loss_channel(&self) -> Receiver<LeaseLost> {
        self.lease.loss_channel()
    }

    /// Renews the lease now with its current time-to-live.
    pub fn renew(&self) -> Result<()> {
        self.renew_with_ttl(self.lease.ttl())
    }

    /// Renews the lease now with a new time-to-live, which later renewals keep.
    /// `Err(LeaseLost)` if the database no longer records this holder.
    ///
    /// Renewals of one lease never overlap: this waits for a background renewal in flight. A
    /// renewal that fails or times out may still run later on the database, so the lease's
    /// deadline then becomes no later than it would be if it had run
    /// ([`remaining`](Self::remaining) shows it): with a shorter time-to-live than the lease's,
    /// the lease ends sooner even if later renewals succeed.
    pub fn renew_with_ttl(&self, ttl: Duration) -> Result<()> {
        let core = &self.lock.core;
        core.settings.check_ttl("time_to_live", ttl)?;
        if let Some(reason) = self.lease.check() {
            return Err(self.lock.lost(reason));
        }
        let deadline = self
            .lease
            .deadline()
            .min(Instant::now() + core.settings.operation_timeout);
        match self.lease.renew(&*core.store, ttl, deadline) {
            Renewal::Renewed => Ok(()),
            Renewal::NotOwner => Err(self
                .lock
                .lost(self.lease.loss().unwrap_or(LossReason::NotOwner))),
            Renewal::Failed(e) => match self.lease.check() {
                Some(reason) => Err(self.lock.lost(reason)),
                None => Err(e),
            },
        }
    }

    /// Releases the lock and reports whether the lease was still held until then.
    ///
    /// `Err(LeaseLost)` means another instance may have held the lock while this guard
    /// existed. For a nested (reentrant) guard this only lowers the hold count.
    pub fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.measure_release();
        self.lock.release(&self.lease)
    }

    /// Records how long this guard held the lock (an outermost guard only).
    fn measure_release(&mut self) {
        if let Some(since) = self.held_since.take() {
            self.lock
                .core
                .meter
                .released(&self.lock.key, since.elapsed());
        }
    }

    /// Releases the lock but leaves the row held by this registry until `keep` after the grant
    /// (on the database clock), or releases it outright if that time has passed: ShedLock's
    /// `lockAtLeastFor`. A job that every host starts on the same schedule then runs once per
    /// period, even when a host starts it a little late or a run ends early — the others find
    /// the lock held until the period ends. Renewal stops here; the row simply runs out.
    ///
    /// Nobody takes the lock before then, not even threads of this registry: the lease is
    /// released to the database even when local threads queue (no local handoff), and they
    /// poll until the row runs out. For a nested (reentrant) guard this only lowers the hold
    /// count and `keep` does not apply. `keep` is at most
    /// [`MAX_TIME_TO_LIVE`](crate::MAX_TIME_TO_LIVE); a longer one is refused with
    /// [`Error::InvalidSetting`] and the lock is released as by [`unlock`](Self::unlock).
    /// `Err(LeaseLost)` as for `unlock`.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("l.db");
    /// use std::time::Duration;
    /// let host_a = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
    /// let host_b = leasehold::LockRegistry::sqlite(&path).build()?;
    /// let guard = host_a.obtain("daily-report")?.lock()?;
    /// // ... the report, done in seconds ...
    /// guard.unlock_keeping_for(Duration::from_secs(600))?;
    /// // Host B's run of the same job, started a little later, finds it taken.
    /// assert!(host_b.obtain("daily-report")?.try_lock()?.is_none());
    /// # Ok(()) }
    /// ```
    pub fn unlock_keeping_for(mut self, keep: Duration) -> Result<()> {
        if keep > crate::MAX_TIME_TO_LIVE {
            // Released as by `unlock`, but at once: a caller who asked to keep the row did
            // not mean a local thread to have it (no linger).
            self.released = true;
            self.measure_release();
            if let Err(e) = self.lock.release_keeping(&self.lease, None, false) {
                log::warn!("releasing lock {:?}: {e}", self.lock.key);
            }
            return Err(Error::setting(
                "keep",
                format!(
                    "{keep:?} is longer than {:?}; keep a row at most as long as a lease",
                    crate::MAX_TIME_TO_LIVE
                ),
            ));
        }
        self.released = true;
        self.measure_release();
        self.lock.release_keeping(&self.lease, Some(keep), false)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            self.measure_release();
            if let Err(e) = self.lock.release(&self.lease) {
                log::warn!("releasing lock {:?} on drop: {e}", self.lock.key);
            }
        }
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lock.key)
            .field("fencing_token", &self.lease.token)
            .field("held", &self.lease.is_held())
            .finish()
    }
}
