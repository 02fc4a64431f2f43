//! One key inside one registry: the local queue, the handoff between threads, and the guard.
//!
//! # State machine
//!
//! Each [`Lock`] handle points at one `LockInner` per (registry, key). Its `LocalState` sits
//! behind a mutex; each thread that wants the key waits in its queue on a condition variable of
//! its own:
//!
//! | state | `owner` | `lease` | what a thread that wants the key does |
//! |-------|---------|---------|---------------------------------------|
//! | free | none | none | becomes the *poller* (`db_user`) and runs **acquire**, unless another thread already polls or the registry stays away after a turn |
//! | held | holder T | some | T, a thread: nested guard (`depth` + 1); others queue and wait |
//! | lingering | none | some | takes the lease at once, without a statement (a *re-take*) |
//!
//! | transition | from → to | statement |
//! |------------|-----------|-----------|
//! | grant | free → held | acquire (the poller's) |
//! | handoff | held → held (the oldest queued thread) | none |
//! | linger | held → lingering | none |
//! | re-take | lingering → held | none |
//! | release | held or lingering → free | release |
//!
//! Invariant: a lease is present exactly while an owner holds it or while it lingers. The
//! poller and the releasing thread set `db_user` for the duration of their statement, so at
//! most one statement per key and registry is in flight.
//!
//! A *holder* is a thread ([`ThisThread`] guards, the default: they nest, and stay on the
//! thread) or one guard for any thread ([`AnyThread`]: `Send`, no nesting, named by a number
//! of its own). Handoffs, lingers and releases treat both alike; only the nested acquire asks
//! which thread calls. A semaphore's permit and a reader/writer lock's guards are taken for the
//! calling thread and then given to their kind's holder, under the key's mutex, before the
//! caller sees them. Lock sets (`set`) take their keys one by one through this machinery.
//!
//! # Mechanisms, each with the bound it gives
//!
//! **One poller per key.** Every thread inside an acquire of the key sits in a FIFO `queue`,
//! and only one of them talks to the database, the oldest when it starts polling (a thread that
//! let the key go and asks again comes after those already waiting): N threads of a registry
//! waiting for a key held elsewhere cost one acquire statement per poll, not N. Between
//! attempts the poller sleeps a random time between ½ and 1 × `idle_between_tries`
//! ([`jittered`]), so that pollers of several instances with one interval do not keep a phase
//! in which one of them always comes first; a release wake-up cuts the sleep short. A waiting instance therefore tries the key at
//! least once per `idle_between_tries`, and at once when a release wake-up reaches it. On
//! SQLite the poller sleeps on its key's slot of the release board, which the release in the
//! other process wakes directly (see `Watch`); elsewhere the registry's release listener sets
//! `nudged` (see [`crate::wakeups`]).
//!
//! **Local handoff.** A release while threads of this registry queue gives the lock to the
//! oldest of them: the owner is set to that thread before it wakes, the lease (and so the
//! fencing token) stays, and no statement runs. The handoff wakes that thread alone; the
//! others sleep on, as nothing they wait for has changed. Every other change they may act on
//! (a release to the database, a release wake-up, a waiter that leaves without the lock and
//! may leave the key without a poller, the registry closing) wakes the whole queue. Threads
//! of one registry get the key in the order they asked for it. Tokens order database grants;
//! the local holders of one grant are ordered by this mutex (`Tuning::local_handoff` off gives
//! every holder a grant and a token of its own). The previous holder's loss channels
//! disconnect at the handoff.
//!
//! **Linger.** A release that finds nobody queued keeps the lease for `Tuning::linger` (5 ms by
//! default) instead of releasing it, when the grant has already passed between threads of
//! this registry (`shared`: several of them use the key). A thread of this registry that comes
//! for the key meanwhile takes it as a handoff; a linger that runs out is released by the
//! registry's [`Lingerer`]. A key that only one thread uses never lingers. Another instance
//! waits at most `linger` longer for a key, and re-takes count against the turn.
//!
//! **Bounded turn.** A *turn* runs from a database grant through its handoffs and re-takes,
//! and through grants of this registry that follow its own release within 3 ×
//! `idle_between_tries` (a key kept busy by one registry's quick re-grants is one turn). Its
//! length is drawn at its grant between ½ and 1 × `Tuning::turn_limit` (500 ms by default),
//! as [`jittered`] draws a poller's sleep, and handoffs and lingers happen only within it.
//! The draw keeps turn ends at no fixed phase of the polls of an instance that polls at a
//! fixed interval from the moment it lost the key (Spring Integration's does): otherwise that
//! instance would come first at every turn end, ahead of other instances that wait longer.
//! A release past the turn's length goes to the database; if the grant was shared or threads
//! of this registry still queue, it *ends the turn*: the release statement reserves the row
//! for 2 × `idle_between_tries` (`CREATED_DATE` set to the reservation's end, which
//! leasehold's grant waits for and Spring Integration's ignores) and wakes nobody. A polling
//! instance that ignores the reservation (Spring's, every 100 ms by default) has those two
//! intervals to itself; then the waiting line decides (below). So while other instances wait,
//! the key leaves this registry at least once per `turn_limit` + the longest hold. A single
//! hold, however long, and a key passed between instances one hold at a time never end a
//! turn: their releases are plain ones that wake the other waiters. Without a waiting line
//! (its table missing), this registry's threads also stay away from the key for 3 ×
//! `idle_between_tries` after ending a turn (`last_release`), so that another leasehold
//! instance tries at least once in the third interval, and the key rests that long after
//! each turn even when nobody else wants it.
//!
//! **Waiting in line.** Instances that wait for a key keep places in the database's waiting
//! line (`backend::queue`), and a free row goes to the instance with the oldest live place.
//! After a refused acquire, a poller that will poll again takes this registry's place (one
//! per key and registry: its threads share it and keep their local FIFO order), and
//! refreshes it every quarter of its time-to-live (`Settings::place_ttl`: 5 ×
//! `idle_between_tries`, at least 1 s) while it waits; a place not refreshed — its instance
//! crashed or froze — lapses after that time-to-live and holds nobody back any more. The
//! acquire statement grants a free row only when no other instance has an earlier live place
//! (an instance without a place comes after every live one), and a grant gives up the place
//! (PostgreSQL's acquire statement removes it; elsewhere a statement in the background does,
//! while this registry sends no acquire of the key). The last thread of a registry that stops
//! waiting gives the place up the same way. So an instance that waits is granted the key after
//! at most the turns of the instances ahead of it in line, each at most `turn_limit` + the
//! longest hold + the 2 × `idle_between_tries` reservation that ends it + the time the next
//! in line takes to try (at once when a release wakes it, else within its own
//! `idle_between_tries`), and after the holds of instances that do not know the line (Spring
//! Integration's), which take the free row whenever they try. A newcomer's try (`try_lock`)
//! finds a free key that others wait for in line taken. On MySQL/MariaDB the acquire reads the
//! line with row locks; a place another statement holds locked that instant (being taken,
//! refreshed or left) is skipped, and counts as absent for that one statement. Without the
//! table (not created, or a replacement acquire statement) there is no line: each turn end
//! goes to whichever waiting instance tries first.
//!
//! **Unknown outcomes.** An acquire statement that was sent and got no answer — none before the
//! call's deadline, or a connection that broke — may still have granted the row on the server,
//! or may do so later while it waits there. The store never sends the next acquire of the key
//! before that is settled (*resolved*): it ends the server session that ran the statement and
//! waits until it is gone (PostgreSQL `pg_terminate_backend` on a connection straight to the
//! server, MySQL/MariaDB `KILL CONNECTION`, each only on the server instance that gave the
//! session; SQLite's statements end before their call returns),
//! after which nothing sent to it can grant anything, then releases the row if it names this
//! registry's client id. Client ids belong to one registry, and the key has no other acquire in
//! flight meanwhile, so such a row can only be that statement's grant. When the call's time
//! allows, this happens inside the call, which then tries again; otherwise the key is
//! `resolving`: a short-lived thread of its own resolves it and wakes the queue, nobody of this
//! registry polls the key meanwhile, and the call ends as its wait says — `Ok(None)` when it had
//! found the key held, else the error. So a grant nobody holds lasts one resolution (a few
//! round trips) once the database answers, never a time-to-live; a grant whose answer came
//! after its time-to-live ran out is given back the same way. Behind a pooler the session is
//! not known: the row is looked at once the statement's connection is gone, which leaves a
//! statement still queued in the pooler to grant after the look. Closing and dropping the
//! registry wait for resolutions in flight (up to `operation_timeout`).
//!
//! **Unwinding.** A panic inside an acquire or a release (a bug, or a fail point in tests)
//! leaves the state as if the call had returned: the thread leaves the queue, stops being the
//! key's database user, and a grant it had is handed on or released.

mod guard;
mod linger;
mod rows;
mod set;

pub use guard::{AnyThread, Holding, Lock, LockGuard, ThisThread};
pub(crate) use linger::Lingerer;
pub(crate) use rows::{Patience, KEYED_WATCHES};
pub use set::{LockSet, LockSetGuard};

use crate::backend::{jittered, Acquired, ReleaseWait};
use crate::core::Core;
use crate::error::{Error, LossReason, Result};
use crate::lease::{Lease, Owner};
use crate::wakeups::Nudge;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Who holds a key in this registry, or waits for it, or runs a statement about it: a thread
/// (whose guards of the key nest, see [`ThisThread`]) or one guard that any thread may hold
/// (see [`AnyThread`]), named by a number no other guard has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    Thread(ThreadId),
    Guard(u64),
}

impl Holder {
    pub(crate) fn this_thread() -> Holder {
        Holder::Thread(std::thread::current().id())
    }

    /// A holder nobody else is or will be.
    pub(crate) fn new_guard() -> Holder {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Holder::Guard(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// The states of one registry's semaphore slots or reader/writer rows, by `LOCK_KEY`: one
/// `LockInner` per row while anything refers to it or it is not idle (a job in the
/// background, such as the resolution of an acquire, keeps it from being idle), however often
/// the semaphore or reader/writer lock is dropped and obtained again. A row whose acquire is
/// being resolved is therefore polled by nobody of the registry until that ends (see
/// "Unknown outcomes"), as a plain lock's key is, which the handle cache keeps on the same
/// terms. States nobody uses are swept out when the map has doubled since the last sweep.
#[derive(Default)]
pub(crate) struct RowStates {
    live: HashMap<Arc<str>, Arc<LockInner>>,
    /// The size at which unused states are swept out next.
    sweep_at: usize,
}

impl RowStates {
    /// The state of row `lock_key`, made with `make` if there is none.
    pub fn get_or_make(
        &mut self,
        lock_key: &str,
        make: impl FnOnce() -> Arc<LockInner>,
    ) -> Arc<LockInner> {
        if let Some(inner) = self.live.get(lock_key) {
            return Arc::clone(inner);
        }
        if self.live.len() >= self.sweep_at {
            self.live
                .retain(|_, inner| Arc::strong_count(inner) > 1 || !inner.is_idle());
            self.sweep_at = (2 * self.live.len()).max(64);
        }
        let inner = make();
        self.live
            .insert(Arc::clone(&inner.lock_key), Arc::clone(&inner));
        inner
    }
}

/// The key's state in this registry (see the module docs).
struct LocalState {
    /// The holder of the lock.
    owner: Option<Holder>,
    /// The owner's nested guards.
    depth: u32,
    /// The database grant: present while an owner holds it or while it lingers.
    lease: Option<Arc<Lease>>,
    /// Threads inside an acquire of this key, oldest first: a release hands over to the front.
    queue: VecDeque<Waiter>,
    /// Who runs a statement for this key (polling or releasing), if anyone.
    db_user: Option<Holder>,
    /// The resolution of an acquire of this key whose outcome is unknown runs in the
    /// background (see "Unknown outcomes"): nobody polls the key meanwhile.
    resolving: bool,
    /// Leaving the key's waiting line runs in the background (see "Waiting in line"): no place
    /// is taken meanwhile, so that the leaving cannot remove a newer one.
    leaving: bool,
    /// When this registry last took or refreshed its place in the key's waiting line, while
    /// it has one (see "Waiting in line").
    place: Option<Instant>,
    /// Set by a release wake-up: the poller tries again now.
    nudged: bool,
    /// When the current turn's handoffs and lingers end (see "Bounded turn"); `None` without a
    /// `turn_limit`.
    turn_ends: Option<Instant>,
    /// The current grant has passed between threads of this registry (a handoff or a re-take).
    shared: bool,
    /// When this registry last released the key to the database, and whether that release
    /// ended a turn (its threads then stay away for a while).
    last_release: Option<(Instant, bool)>,
    /// The end of the latest linger, while the registry's [`Lingerer`] has an entry for the
    /// key. The key lingers when it has a lease and no owner.
    linger_end: Option<Instant>,
}

/// A thread inside an acquire of a key, and the condition variable it waits on: its own, so
/// that a handoff wakes only the thread it hands to.
struct Waiter {
    holder: Holder,
    wake: Arc<Condvar>,
}

thread_local! {
    /// The condition variable this thread waits on in any key's queue (one key at a time).
    static WAKE: Arc<Condvar> = Arc::new(Condvar::new());
}

/// What a statement about a key that runs in the background needs (see
/// [`LockInner::in_background`]).
struct Job {
    store: Arc<dyn crate::backend::Store>,
    lock_key: Arc<str>,
    key: Arc<str>,
    timeout: Duration,
}

/// A statement about a key that runs in the background, and what it keeps from happening
/// meanwhile (see [`LockInner::in_background`]).
#[derive(Clone, Copy)]
enum Background {
    /// Resolving an acquire whose outcome is unknown: no poll.
    Resolving,
    /// Leaving the waiting line: no place taken.
    Leaving,
}

impl Background {
    fn flag(self, state: &mut LocalState) -> &mut bool {
        match self {
            Background::Resolving => &mut state.resolving,
            Background::Leaving => &mut state.leaving,
        }
    }
}

/// What the registry's [`Lingerer`] finds at a key's entry.
enum LingerDue {
    /// The linger is over: release the lease.
    Over,
    /// A later linger ends then.
    Later(Instant),
    /// The key no longer lingers.
    Gone,
}

impl LocalState {
    fn lingers(&self) -> bool {
        self.owner.is_none() && self.lease.is_some()
    }

    /// Whether the current turn has reached its end.
    fn turn_over(&self, now: Instant) -> bool {
        self.turn_ends.is_some_and(|end| now >= end)
    }

    /// Wakes every thread in the queue to look at the state again.
    fn wake_all(&self) {
        for waiter in &self.queue {
            waiter.wake.notify_one();
        }
    }
}

/// How one waiting call hears of its key's releases elsewhere: where the backend lets a
/// waiter sleep on its own ([`crate::backend::Backend::WAITERS_WAIT_THEMSELVES`], SQLite), its
/// own sleep, opened at its first refused attempt; elsewhere the registry's release listener
/// ([`crate::wakeups`]).
#[derive(Default)]
struct Watch {
    /// Registered with the registry's wake-ups: unregister when the call ends.
    registered: bool,
    /// The call's own sleep, while it has one.
    own: Option<Box<dyn ReleaseWait>>,
    /// The own sleep was asked for (once per call).
    opened: bool,
}

impl Watch {
    /// Before an attempt that may be followed by a sleep.
    fn before_attempt(&mut self, inner: &Arc<LockInner>) {
        if let Some(own) = &mut self.own {
            own.arm();
        } else if !inner.waits_itself() {
            self.registered |= inner
                .core
                .wakeups
                .register(&inner.lock_key, inner.as_poller());
        }
    }

    /// After the call's first refused attempt, where waiters wait on their own: opens the
    /// sleep. `true` when it did (releases that committed before it are not announced to it,
    /// so the caller tries once more before sleeping).
    fn open(&mut self, inner: &LockInner) -> bool {
        if self.opened || !inner.waits_itself() {
            return false;
        }
        self.opened = true;
        self.own = inner.core.store.release_wait(&inner.lock_key);
        self.own.is_some()
    }
}

/// Shared state of one key in one registry.
pub(crate) struct LockInner {
    key: Arc<str>,
    lock_key: Arc<str>,
    core: Arc<Core>,
    state: Mutex<LocalState>,
    /// The registry's lingerer, for a key whose releases may linger: a plain lock's key (not
    /// a semaphore's permit or a side of a reader/writer lock, whose rows other code reasons
    /// about).
    lingerer: Option<Arc<Lingerer>>,
    /// Whether a grant's loss goes to the registry's loss callback from the start. `false`
    /// for rows that are not the user's grant when taken (a reader/writer lock's claim rows
    /// and write row): their owner hands a lease to the callback once it is one
    /// ([`Lease::report_losses`]).
    reports_losses: bool,
}

impl LockInner {
    /// A plain lock's key; its releases may linger, ended by `lingerer`.
    pub fn new(key: &str, core: Arc<Core>, lingerer: &Arc<Lingerer>) -> Self {
        let mut inner = Self::with_lock_key(key, crate::key::lock_key_for(key), core);
        inner.lingerer = Some(Arc::clone(lingerer));
        inner
    }

    /// A key whose row is `lock_key` rather than the key's UUID (a semaphore's permit).
    /// Shares this key's state, tracked by the core so that closing the registry wakes the
    /// threads waiting on it.
    pub fn tracked(self) -> Arc<Self> {
        let inner = Arc::new(self);
        let waitable: Weak<dyn Nudge> = Arc::downgrade(&inner) as Weak<dyn Nudge>;
        inner.core.track(waitable);
        inner
    }

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
                resolving: false,
                leaving: false,
                place: None,
                nudged: false,
                turn_ends: None,
                shared: false,
                last_release: None,
                linger_end: None,
            }),
            lingerer: None,
            reports_losses: true,
        }
    }

    /// A row whose grants' losses are not reported to the registry's callback until its owner
    /// says so (see [`LockInner::reports_losses`]).
    pub fn unreported(mut self) -> Self {
        self.reports_losses = false;
        self
    }

    /// Whether a waiting thread of this key hears of releases elsewhere on its own (see
    /// [`Watch`]), rather than through the registry's listener.
    fn waits_itself(&self) -> bool {
        self.core.wakeups.is_enabled() && self.core.store.waiters_wait_themselves()
    }

    /// `true` while no thread holds, waits for, or talks to the database about this key: the
    /// cache may then drop it.
    pub fn is_idle(&self) -> bool {
        let state = self.state.lock();
        state.owner.is_none()
            && state.lease.is_none()
            && state.queue.is_empty()
            && state.db_user.is_none()
            && !state.resolving
            && !state.leaving
    }

    fn acquire<H: Holding>(
        self: &Arc<Self>,
        wait: Wait,
        ttl: Duration,
    ) -> Result<Option<LockGuard<H>>> {
        self.core.settings.check_ttl("time_to_live", ttl)?;
        let called = Instant::now();
        let me = H::holder();
        let mut state = self.state.lock();
        if state.owner == Some(me) {
            let lease = state.lease.clone().expect("an owner always has a lease");
            if let Some(reason) = lease.check() {
                return Err(self.lost(reason));
            }
            state.depth += 1;
            return Ok(Some(self.guard(lease)));
        }
        if state.owner == Some(Holder::this_thread()) {
            // It would wait for a guard only this thread can drop.
            return Err(Error::setting(
                "any_thread",
                format!(
                    "this thread holds {:?} already, through a guard that stays on it; a guard \
                     for any thread does not nest: drop that guard first, or take this one with \
                     the lock's own methods (they nest on this thread)",
                    self.key
                ),
            ));
        }
        // A condition variable of its own also for a thread whose thread-locals are being
        // destroyed (a lock taken in a thread-local's destructor).
        let wake = WAKE
            .try_with(Arc::clone)
            .unwrap_or_else(|_| Arc::new(Condvar::new()));
        state.queue.push_back(Waiter {
            holder: me,
            wake: Arc::clone(&wake),
        });
        fail_point!("lock::queued");
        let mut watch = Watch::default();
        // Unwind-safe: whatever panics inside (a bug, a fail point), this thread leaves the
        // queue, stops being the poller, and a grant it got is handed on or released.
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
            self.acquire_locked(&mut state, me, &wake, wait, ttl, &mut watch)
        }));
        if watch.registered {
            self.core
                .wakeups
                .unregister(&self.lock_key, &self.as_poller());
        }
        if let Some(position) = state.queue.iter().position(|waiter| waiter.holder == me) {
            state.queue.remove(position);
        }
        if state.db_user == Some(me) {
            state.db_user = None;
        }
        // A thread that leaves without the lock may leave the key without a poller: the
        // others look again. One that leaves holding it changes nothing they wait for.
        if state.owner != Some(me) {
            state.wake_all();
            // The last waiter of this registry gives up its place in line.
            if state.queue.is_empty() && state.db_user.is_none() && state.place.take().is_some() {
                self.in_background(&mut state, Background::Leaving, LockInner::leave_line);
            }
        }
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(panic) => {
                let orphan = state.lease.clone().filter(|_| state.owner == Some(me));
                drop(state);
                drop(orphan.map(|lease| self.guard::<H>(lease)));
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
            // Handed over from a holder with another time-to-live: the renewal thread renews
            // with this one at once; the call itself runs no statement and cannot fail.
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
        me: Holder,
        wake: &Condvar,
        wait: Wait,
        ttl: Duration,
        watch: &mut Watch,
    ) -> Result<Option<(Arc<Lease>, bool, bool)>> {
        let settings = &self.core.settings;
        // The first pass reads no clock again: it is the start of the wait.
        let started = Instant::now();
        let mut first_pass = Some(started);
        // This call has waited: an attempt found the key held, or it waited behind another
        // thread of the registry (holding or polling).
        let mut waited = false;
        loop {
            let now = first_pass.take().unwrap_or_else(Instant::now);
            if state.owner == Some(me) {
                let lease = state.lease.clone().expect("an owner always has a lease");
                let retune = lease.ttl() != ttl;
                return Ok(Some((lease, retune, true)));
            }
            self.core.check_open()?;
            if state.lingers() {
                let lease = state.lease.clone().expect("a linger keeps its lease");
                // A lease lost while it lingered is never handed on: it is released, and
                // this thread asks the database like any other.
                if !state.turn_over(now) && lease.check().is_none() {
                    state.owner = Some(me);
                    state.depth = 1;
                    state.shared = true;
                    let retune = lease.ttl() != ttl;
                    return Ok(Some((lease, retune, true)));
                }
                // This thread wants the key: a turn past its limit ends here.
                self.release_lingering(state, true);
                continue;
            }
            // Without a waiting line, the registry stays away after its turn (with one, the
            // line puts its next request behind those of the instances that wait).
            let away = state
                .last_release
                .filter(|(_, ended_turn)| *ended_turn && !self.core.store.has_line())
                .map(|(at, _)| at + settings.turn_gap())
                .filter(|until| *until > now);
            if state.owner.is_none()
                && state.db_user.is_none()
                && !state.resolving
                && !state.leaving
                && away.is_none()
                && state.queue.front().is_some_and(|first| first.holder == me)
            {
                let attempt_deadline = match wait {
                    Wait::Until(deadline) | Wait::Once(deadline) => {
                        deadline.max(now + Duration::from_millis(1))
                    }
                    _ => now + settings.operation_timeout,
                };
                if !matches!(wait, Wait::No | Wait::Once(_)) {
                    watch.before_attempt(self);
                }
                // A release notified from here on cuts the sleep after a failed attempt
                // short, even one that arrives while the attempt is in flight.
                state.nudged = false;
                state.db_user = Some(me);
                let granted = MutexGuard::unlocked(state, || {
                    fail_point!("lock::acquire_before_statement");
                    self.core
                        .store
                        .acquire(&self.lock_key, &self.key, ttl, attempt_deadline)
                });
                state.db_user = None;
                let arrived = Instant::now();
                let granted = match granted {
                    // The call has waited for a key held (here or elsewhere) and the caller's
                    // time ran out on this attempt (often waiting for a pooled connection):
                    // "held".
                    Err(Error::Timeout { .. }) if waited && matches!(wait, Wait::Until(_)) => {
                        return Ok(None)
                    }
                    other => other?,
                };
                match granted {
                    Acquired::Unresolved { session, error } => {
                        self.resolve_later(state, session, ttl);
                        let over = match wait {
                            Wait::No | Wait::Once(_) => true,
                            Wait::Until(deadline) => deadline <= arrived,
                            Wait::Forever => false,
                        };
                        match (over, waited) {
                            (false, _) => continue,
                            (true, true) => return Ok(None),
                            (true, false) => return Err(error),
                        }
                    }
                    // The statement waited so long (a row lock, a stalled server) that the
                    // lease would be over on arrival: not a usable grant; it is given back.
                    Acquired::Granted(grant)
                        if Lease::grant_deadline(grant.sent_at, ttl) <= arrived =>
                    {
                        log::warn!(
                            "the grant of {:?} arrived after its time-to-live ({ttl:?}) ran \
                             out; trying again",
                            self.key
                        );
                        self.resolve_later(state, None, ttl);
                        if matches!(wait, Wait::No | Wait::Once(_)) {
                            return Ok(None);
                        }
                        continue;
                    }
                    Acquired::Granted(grant) => {
                        let lease = Lease::start(
                            Arc::clone(&self.key),
                            Arc::clone(&self.lock_key),
                            grant,
                            ttl,
                            Owner {
                                renewer: &self.core.renewer,
                                settings: settings.keeper,
                                on_lost: self
                                    .reports_losses
                                    .then_some(self.core.on_lost.as_ref())
                                    .flatten(),
                                meter: &self.core.meter,
                            },
                        );
                        state.lease = Some(Arc::clone(&lease));
                        state.owner = Some(me);
                        state.depth = 1;
                        // Its place in line, unless the grant removed it, goes off the grant's
                        // path: until it has, it only keeps others of the line waiting.
                        if state.place.take().is_some() && !self.core.store.grant_leaves_line() {
                            self.in_background(state, Background::Leaving, LockInner::leave_line);
                        }
                        // A grant soon after this registry's own plain release continues
                        // its turn, unless that turn is over.
                        let continues = !state.turn_over(arrived)
                            && state.last_release.is_some_and(|(at, ended_turn)| {
                                !ended_turn
                                    && arrived.saturating_duration_since(at) < settings.turn_gap()
                            });
                        if !continues {
                            state.turn_ends =
                                settings.turn_limit.map(|limit| arrived + jittered(limit));
                            state.shared = false;
                        }
                        return Ok(Some((lease, false, false)));
                    }
                    // The database answered busy throughout (on SQLite another connection,
                    // such as a fenced transaction, holds the file's write lock): a wait
                    // without a deadline polls again, as after a refusal; a bounded one
                    // reports the timeout (as `Ok(None)` once it has waited, as above).
                    Acquired::Busy(_) if waited && matches!(wait, Wait::Until(_)) => {
                        return Ok(None)
                    }
                    Acquired::Busy(error) if !matches!(wait, Wait::Forever) => return Err(error),
                    Acquired::Held | Acquired::Busy(_) => {
                        waited = true;
                        self.core.meter.contended(&self.key);
                        let next_poll = Instant::now() + jittered(settings.idle_between_tries);
                        let wake_at = match wait {
                            Wait::No | Wait::Once(_) => return Ok(None),
                            Wait::Until(deadline) if deadline <= Instant::now() => return Ok(None),
                            Wait::Until(deadline) => next_poll.min(deadline),
                            Wait::Forever => next_poll,
                        };
                        state.db_user = Some(me);
                        if wake_at == next_poll {
                            self.keep_place(state);
                        }
                        // Opening the sleep (a lock on the board file) runs outside the key's
                        // mutex, still as its poller.
                        if MutexGuard::unlocked(state, || watch.open(self)) {
                            // Releases from now on end this thread's sleeps: one that came
                            // before is found by another attempt now.
                            state.db_user = None;
                            continue;
                        }
                        self.sleep_between_polls(state, wake, wake_at, watch);
                        state.db_user = None;
                        continue;
                    }
                }
            }
            // A single attempt waits for a resolution in progress (the key may be this
            // registry's) or for its place to leave the line (else the acquire would go by
            // that stale place, ahead of instances that waited longer), as long as its
            // statement could have taken.
            let resolution_waits =
                (state.resolving || state.leaving) && state.owner.is_none() && !waited;
            let until = match wait {
                Wait::No if resolution_waits && now < started + settings.operation_timeout => {
                    Some(started + settings.operation_timeout)
                }
                Wait::Once(at) if resolution_waits && now < at => Some(at),
                Wait::No | Wait::Once(_) => return Ok(None),
                Wait::Until(deadline) if deadline <= now => return Ok(None),
                Wait::Until(deadline) => Some(away.map_or(deadline, |away| away.min(deadline))),
                Wait::Forever => away,
            };
            waited = !resolution_waits || !matches!(wait, Wait::No | Wait::Once(_));
            match until {
                Some(until) => {
                    wake.wait_until(state, until);
                }
                None => wake.wait(state),
            }
            // A woken waiter that is slow to run again (test-only).
            #[cfg(feature = "failpoints")]
            MutexGuard::unlocked(state, || {
                fail_point!("lock::waiter_woken");
            });
        }
    }

    /// Takes this registry's place in the key's waiting line, or refreshes it when a quarter
    /// of its time-to-live has passed (see "Waiting in line"); run by the poller after a
    /// refusal when it will poll again. A failure only leaves this registry without a place.
    fn keep_place(&self, state: &mut MutexGuard<'_, LocalState>) {
        let settings = &self.core.settings;
        let place_ttl = settings.place_ttl();
        let now = Instant::now();
        let fresh = state
            .place
            .is_some_and(|at| now.saturating_duration_since(at) < place_ttl / 4);
        if fresh || state.leaving || !self.core.store.has_line() {
            return;
        }
        let deadline = now + settings.operation_timeout;
        let taken = MutexGuard::unlocked(state, || {
            self.core
                .store
                .take_place(&self.lock_key, place_ttl, deadline)
        });
        state.place = match taken {
            Ok(()) => Some(now),
            Err(e) => {
                log::debug!("taking a place in the line of {:?}: {e}", self.key);
                None
            }
        };
    }

    /// Leaves the key's waiting line (in the background, see [`LockInner::in_background`]);
    /// a failure leaves the place to lapse.
    fn leave_line(job: &Job) {
        let deadline = Instant::now() + job.timeout;
        if let Err(e) = job.store.leave_line(&job.lock_key, deadline) {
            log::debug!("leaving the line of {:?}: {e}; the place lapses", job.key);
        }
    }

    /// Runs `job` on a short-lived thread of its own while the key's state says so (`kind`),
    /// then wakes the queue; closing and dropping the registry wait for it. The thread keeps
    /// the store, not the registry: a registry dropped meanwhile goes (its listener with it),
    /// and the statement still runs.
    fn in_background(
        self: &Arc<Self>,
        state: &mut MutexGuard<'_, LocalState>,
        kind: Background,
        job: impl FnOnce(&Job) + Send + 'static,
    ) {
        *kind.flag(state) = true;
        let context = Job {
            store: Arc::clone(&self.core.store),
            lock_key: Arc::clone(&self.lock_key),
            key: Arc::clone(&self.key),
            timeout: self.core.settings.operation_timeout,
        };
        // Only a weak reference: the job keeps neither the key's state nor its registry alive
        // (the handle cache and `RowStates` keep the state while it is not idle).
        let lock = Arc::downgrade(self);
        let counted = self.core.resolutions.begin();
        let run = move || {
            fail_point!("lock::background_job_starts");
            job(&context);
            if let Some(lock) = lock.upgrade() {
                let mut state = lock.state.lock();
                *kind.flag(&mut state) = false;
                state.wake_all();
            }
            drop(counted);
        };
        let spawned = std::thread::Builder::new()
            .name("leasehold-resolve".into())
            .spawn(run);
        if let Err(e) = spawned {
            log::error!(
                "could not start a thread for {:?} ({e}): a grant or place it would have given \
                 back runs out at its time-to-live",
                self.key
            );
            *kind.flag(state) = false;
        }
    }

    /// Resolves an acquire whose outcome is unknown (see "Unknown outcomes") in the
    /// background; `session`: the server session that ran the statement, when known.
    /// Resolution attempts, each bounded by `operation_timeout`, go on until one succeeds or
    /// for `ttl` at most: a grant made before then has expired by the end.
    fn resolve_later(
        self: &Arc<Self>,
        state: &mut MutexGuard<'_, LocalState>,
        session: Option<crate::backend::Session>,
        ttl: Duration,
    ) {
        self.in_background(state, Background::Resolving, move |job| {
            let timeout = job.timeout;
            let give_up = Instant::now() + ttl.max(timeout);
            loop {
                let deadline = (Instant::now() + timeout).min(give_up);
                match job.store.resolve(&job.lock_key, session.as_ref(), deadline) {
                    Ok(released) => {
                        if released {
                            log::info!(
                                "an acquire of {:?} had been granted without an answer: \
                                 given back",
                                job.key
                            );
                        }
                        return;
                    }
                    Err(e) if Instant::now() < give_up => {
                        log::debug!("resolving an acquire of {:?}: {e}; trying again", job.key);
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => {
                        log::warn!(
                            "an acquire of {:?} got no answer and could not be resolved ({e}); \
                             a grant it made runs out at its time-to-live",
                            job.key
                        );
                        return;
                    }
                }
            }
        });
    }

    /// The poller's sleep until its next attempt; a release (since the attempt was sent)
    /// cuts it short.
    fn sleep_between_polls(
        &self,
        state: &mut MutexGuard<'_, LocalState>,
        wake: &Condvar,
        wake_at: Instant,
        watch: &mut Watch,
    ) {
        if watch.registered {
            self.core.wakeups.before_sleep();
        }
        while Instant::now() < wake_at && !state.nudged && !self.core.is_closed() {
            let Some(own) = &watch.own else {
                wake.wait_until(state, wake_at);
                continue;
            };
            match MutexGuard::unlocked(state, || own.sleep(wake_at)) {
                Some(true) => return,
                Some(false) => {}
                // The board fails: this call polls from now on.
                None => watch.own = None,
            }
        }
    }

    /// This key's poller, as release notifications see it.
    fn as_poller(self: &Arc<Self>) -> Weak<dyn Nudge> {
        Arc::downgrade(self) as Weak<dyn Nudge>
    }

    /// Gives the key held by `from` to `to` (a guard taken for this thread becomes one for any
    /// thread, see [`AnyThread`]); the hold's depth stays.
    fn reown(&self, from: Holder, to: Holder) {
        let mut state = self.state.lock();
        if state.owner == Some(from) {
            state.owner = Some(to);
        }
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
        let now = Instant::now();
        let settings = &self.core.settings;
        let in_turn = !state.turn_over(now);
        if settings.local_handoff && in_turn && lease.is_held() && keep.is_none() {
            if let Some(next) = state.queue.pop_front() {
                state.owner = Some(next.holder);
                state.depth = 1;
                state.shared = true;
                lease.handed_over();
                next.wake.notify_one();
                return Ok(());
            }
            let lingerer = self.lingerer.as_ref().filter(|_| linger && state.shared);
            if let Some(lingerer) = lingerer.filter(|_| !settings.linger.is_zero()) {
                let until = now + settings.linger;
                let queued = state.linger_end.replace(until).is_some();
                lease.handed_over();
                if !queued {
                    lingerer.add(until, Arc::downgrade(self));
                }
                return Ok(());
            }
        }
        let wanted = state.shared || !state.queue.is_empty();
        self.release_now(&mut state, lease, keep, wanted)
    }

    /// Releases `lease` to the database (the state is unlocked around the statement). A turn
    /// past its limit ends here when `wanted`: threads of this registry still want the key.
    fn release_now(
        &self,
        state: &mut MutexGuard<'_, LocalState>,
        lease: &Arc<Lease>,
        keep: Option<Duration>,
        wanted: bool,
    ) -> Result<()> {
        let now = Instant::now();
        let settings = &self.core.settings;
        let reserve = if wanted && keep.is_none() && state.turn_over(now) {
            self.core.meter.turn_ended(&self.key);
            settings.reservation()
        } else {
            Duration::ZERO
        };
        state.last_release = Some((now, !reserve.is_zero()));
        state.lease = None;
        state.db_user = Some(Holder::this_thread());
        let outcome = MutexGuard::unlocked(state, || {
            panic::catch_unwind(AssertUnwindSafe(|| {
                self.release_to_database(lease, reserve, keep)
            }))
        });
        state.db_user = None;
        state.wake_all();
        outcome.unwrap_or_else(|panic| panic::resume_unwind(panic))
    }

    /// Releases a lingering lease to the database: its outcome has no caller to go to, so a
    /// failure is logged (a loss has been reported through the lease already). `wanted`: a
    /// thread of this registry came for the key (a turn past its limit ends).
    fn release_lingering(&self, state: &mut MutexGuard<'_, LocalState>, wanted: bool) {
        let lease = state.lease.clone().expect("a linger keeps its lease");
        if let Err(e) = self.release_now(state, &lease, None, wanted) {
            log::warn!("releasing {:?} after it lingered: {e}", self.key);
        }
    }

    /// The registry's [`Lingerer`] reached this key's entry: the latest linger is over, or
    /// ends later (the entry is due again then), or the key no longer lingers (the entry goes).
    fn linger_due(&self) -> LingerDue {
        let mut state = self.state.lock();
        let Some(end) = state.linger_end else {
            return LingerDue::Gone;
        };
        if !state.lingers() {
            state.linger_end = None;
            return LingerDue::Gone;
        }
        if end > Instant::now() {
            return LingerDue::Later(end);
        }
        LingerDue::Over
    }

    /// Releases the lease if its linger is over and nobody took it (a linger begun since is
    /// due again at its end).
    fn end_linger_if_over(self: &Arc<Self>) {
        let mut state = self.state.lock();
        match state.linger_end {
            Some(end) if state.lingers() && end > Instant::now() => {
                if let Some(lingerer) = &self.lingerer {
                    lingerer.add(end, Arc::downgrade(self));
                }
            }
            Some(_) if state.lingers() => {
                state.linger_end = None;
                self.release_lingering(&mut state, false);
            }
            _ => state.linger_end = None,
        }
    }

    /// The release statement; a non-zero `reserve` ends the turn (see the module docs). A
    /// loss known before it (the deadline passed) or found by it (the row has another holder)
    /// is reported through the lease, once, and returned.
    fn release_to_database(
        &self,
        lease: &Lease,
        reserve: Duration,
        keep: Option<Duration>,
    ) -> Result<()> {
        lease.begin_release();
        let deadline = Instant::now() + self.core.settings.operation_timeout;
        fail_point!("lock::release_before_statement");
        let store = &self.core.store;
        let released = match keep {
            Some(keep) => store.release_keeping(&self.lock_key, lease.token, keep, deadline),
            None => store.release(&self.lock_key, lease.token, deadline, reserve),
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

    fn guard<H: Holding>(self: &Arc<Self>, lease: Arc<Lease>) -> LockGuard<H> {
        LockGuard {
            lock: Arc::clone(self),
            lease,
            released: false,
            held_since: None,
            _holder: std::marker::PhantomData,
        }
    }
}

impl Drop for LockInner {
    /// The last handle on the key went (the registry and every `Lock` of it dropped) while
    /// its lease lingered: release the row now rather than leave it to its time-to-live.
    fn drop(&mut self) {
        let Some(lease) = self.state.get_mut().lease.take() else {
            return;
        };
        if let Err(e) = self.release_to_database(&lease, Duration::ZERO, None) {
            log::warn!("releasing {:?}, which lingered, on drop: {e}", self.key);
        }
    }
}
