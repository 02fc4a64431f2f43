//! Counting semaphores: at most N holders of a name across every instance, each holder with a
//! lease of its own.
//!
//! # Storage: a permit is a lock row
//!
//! A semaphore of N permits is N *slots*, and slot `i` is an ordinary lease row of the lock
//! table, taken, renewed, released, fenced and expired exactly as a lock's row is — by the same
//! statements, the same renewal workers, lease clock, loss reporting and release wake-ups. Only
//! its `LOCK_KEY` differs: the 32 hexadecimal digits of the name's UUID (see
//! [`lock_key_for`](crate::lock_key_for)), `#`, and the slot's number in three digits
//! (`acbd18db4cc2385cadef654fccc4a4d8#002`), 36 characters like a UUID but never one. Spring
//! Integration stores only UUIDs (a key that is not one is hashed into one), and so does every
//! plain lock of leasehold: no lock of either can ever name a permit's row, and Spring
//! instances on the same table never take, break or list a permit as one of their locks.
//! `LOCK_NAME` (where the table has it) carries the semaphore's name.
//!
//! The number of permits is part of the semaphore's identity: the first use of a name records
//! it in the semaphore table `{prefix}LOCK_SEM` (`sql/<database>_semaphore.sql`, created by
//! `create_table(true)` and `leasehold init`; see `backend::semaphores`), and an instance that
//! asks for another number gets [`Error::PermitsMismatch`] instead of a semaphore — otherwise
//! one instance with 4 and another with 5 would hold up to 5 between them, or, if slots
//! depended on N, 9. A separate table rather than a descriptor row in the lock table, because a
//! row there would show in every listing and cleanup of the lock table, Spring's included, as a
//! lock held forever; the price is one more table for existing installations to create, which
//! the error names.
//!
//! # Local state machine
//!
//! Each [`Semaphore`] handle points at one `SemaphoreInner` per (registry, name), holding one
//! lock handle per slot and, behind a mutex, only this:
//!
//! | `poller` | meaning | what a thread that wants a permit does |
//! |----------|---------|----------------------------------------|
//! | none | nobody of this registry is looking | becomes the poller: tries the slots |
//! | a thread | it tries the slots or sleeps until its next round | waits on the condition variable |
//!
//! The poller tries each slot once, starting after the slot last granted here (at a random
//! slot at first, so that instances spread over the slots), skipping slots its own thread holds (a permit is not reentrant).
//! A slot held by another thread of this registry costs no statement; a free-looking one costs
//! one acquire statement, which writes nothing when the row is held elsewhere. When every slot
//! is taken it sleeps `idle_between_tries`, cut short by a permit released in this registry or
//! a release notification for a slot from another instance (it registers every slot's key
//! for wake-ups while it waits; on MySQL, where each watched key costs a watcher's connection,
//! only [`KEYED_WATCHES`] of them, from the one it will try first); other local threads sleep
//! on the condition variable and cost nothing. The poller that gets a permit, or gives up,
//! wakes them so that one of them polls.
//!
//! **A row that does not answer.** Another session may hold a slot's row locked (a migration,
//! an operator's `SELECT … FOR UPDATE`), and a statement on it may wait for that lock (the
//! default acquire refuses such a row at once on PostgreSQL and MariaDB and within 1 s on
//! MySQL; a replacement statement or a slow server may take longer). The
//! poller gives each row of a round a share of its time ([`Patience`]: the larger of
//! `idle_between_tries` and 100 ms, never more than the caller's deadline or
//! `operation_timeout`); a row that does not answer in it is passed over like a held one, and
//! the round goes on with the next row. So a locked row costs only that row: a free permit is
//! found in the same round. Later rounds of the same wait pass over that row without a
//! statement for 1, 2, 4, … rounds (at most 64) before they try it again: a statement that
//! ran out of its share may still wait on the server until the lock is released, so a row
//! locked for long costs one such statement now and then, not one per round. A round in which
//! rows were tried and none answered (a server slow for every statement, or gone) doubles the
//! share for the next round, up to the whole statement time, so a slow server is still waited
//! for and a server that is gone still fails the wait.
//!
//! **Handoff.** A permit released while a thread of this registry waits between its tries
//! (`parked` counts them) is handed to it without a statement, through the slot's lock: the
//! releaser puts the slot in `offers` and waits (on the condition variable) until a waiter
//! claims it — or until no parked waiter is left to claim it; the claimant then queues on the
//! slot's lock, still owned by the releaser, and the releaser, once it sees it queued, lets go,
//! which hands the slot's lease over as a lock's handoff does (a claimant that leaves before it
//! was seen queued — its wait ran out on the way in — leaves the release to the database at
//! once; see `crate::lock`): same grant,
//! same fencing token, no statement, bounded by `local_handoff_limit` like a lock's. With
//! `local_handoff(false)` nothing is offered and every holder takes its permit from the
//! database, with a token of its own. A permit whose lease is not held is never offered. A
//! release with nobody parked (the poller in the middle of a round) goes to the database, and
//! the nudge makes the poller look again. Tokens increase per slot across database grants.
//!
//! # Costs and limits
//!
//! A round of the poller is up to N statements when every slot is held elsewhere, so a waiting
//! registry sends up to N / `idle_between_tries` statements per second, all reads of rows that
//! are held. [`MAX_PERMITS`] bounds N for that reason. A try (`try_acquire`) makes one round at
//! most, each statement bounded by `operation_timeout`; the statements of `try_acquire_for`
//! and `try_acquire_until` are bounded by their deadline, and none starts after it.
//!
//! A bounded wait returns `Ok(None)` when no permit was granted in time. It returns
//! [`Error::Timeout`] only when no statement of the wait had an answer from the database (no
//! permit found held, none granted, and no other thread of this registry polling with an
//! answer meanwhile): the database was out of reach for the whole wait.

use crate::admin::{LockRow, LockState};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::lock::{
    AnyThread, Holding, Lock, LockGuard, LockInner, Patience, RowStates, ThisThread, KEYED_WATCHES,
};
use crate::wakeups::Nudge;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

/// The largest number of permits a semaphore may have: a waiting registry polls every slot,
/// so polling costs grow with the number.
pub const MAX_PERMITS: u32 = 256;

/// The `LOCK_KEY` of permit `slot` of semaphore `name`: never a UUID, so never a lock's.
pub(crate) fn slot_lock_key(name: &str, slot: u32) -> String {
    let hex: String = crate::key::lock_key_for(name)
        .chars()
        .filter(|c| *c != '-')
        .collect();
    format!("{hex}#{slot:03}")
}

/// The live semaphores of one registry, by name, and whether the semaphore table was found.
#[derive(Default)]
pub(crate) struct SemaphoreCache {
    table_checked: bool,
    live: HashMap<String, Weak<SemaphoreInner>>,
    /// The states of their slots' rows.
    rows: RowStates,
}

/// The semaphore `name` of the registry with this core and cache (`LockRegistry::semaphore`).
pub(crate) fn obtain(
    core: &Arc<Core>,
    semaphores: &Mutex<SemaphoreCache>,
    name: &str,
    permits: u32,
) -> Result<Semaphore> {
    crate::key::validate_key(name)?;
    if permits == 0 || permits > MAX_PERMITS {
        return Err(Error::setting(
            "permits",
            format!(
                "{permits} is outside 1..={MAX_PERMITS}; a semaphore of one permit is a \
                 lock (use obtain), and a waiter polls every permit's row"
            ),
        ));
    }
    let live = |cache: &SemaphoreCache| cache.live.get(name).and_then(Weak::upgrade);
    let check_table = {
        let cache = semaphores.lock();
        if let Some(inner) = live(&cache) {
            return same_permits(core, inner, permits);
        }
        !cache.table_checked
    };
    let sem_key = crate::key::lock_key_for(name);
    let deadline = Instant::now() + core.settings.operation_timeout;
    let recorded = core
        .store
        .semaphore_permits(&sem_key, permits, check_table, deadline)?;
    let mut cache = semaphores.lock();
    cache.table_checked = true;
    if let Some(inner) = live(&cache) {
        return same_permits(core, inner, permits);
    }
    if recorded != i64::from(permits) {
        return Err(mismatch(core, name, permits, recorded));
    }
    let inner = Arc::new(SemaphoreInner::new(name, permits, core, &mut cache.rows));
    let waitable: Weak<dyn Nudge> = Arc::downgrade(&inner) as Weak<dyn Nudge>;
    core.track(waitable);
    cache.live.retain(|_, known| known.strong_count() > 0);
    cache.live.insert(name.to_string(), Arc::downgrade(&inner));
    Ok(Semaphore {
        inner,
        _holder: PhantomData,
    })
}

fn same_permits(core: &Arc<Core>, inner: Arc<SemaphoreInner>, permits: u32) -> Result<Semaphore> {
    if inner.permits != permits {
        return Err(mismatch(core, &inner.name, permits, inner.permits.into()));
    }
    Ok(Semaphore {
        inner,
        _holder: PhantomData,
    })
}

fn mismatch(core: &Arc<Core>, name: &str, permits: u32, recorded: i64) -> Error {
    let table = crate::backend::semaphore_table(&core.table);
    let fix = format!(
        "DELETE FROM {table} WHERE SEM_KEY = '{}' AND REGION = '{}'",
        crate::key::lock_key_for(name),
        core.region.replace('\'', "''")
    );
    Error::PermitsMismatch {
        name: name.to_string(),
        permits,
        recorded,
        table,
        fix,
    }
}

/// What the table says about a semaphore, for operators: see
/// [`LockRegistry::semaphore_status`](crate::LockRegistry::semaphore_status).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// The number of permits recorded for the semaphore; `None` when none is (no instance
    /// has used the name since the row was deleted, or the table has no semaphore table).
    pub permits: Option<u32>,
    /// The rows of its permits in slot order — held, expired and released — each named with
    /// the semaphore's name. A permit never taken has no row.
    pub rows: Vec<LockRow>,
}

impl SemaphoreStatus {
    /// The rows held now (judged on the database clock by the listing): one per holder.
    pub fn held(&self) -> Vec<&LockRow> {
        self.rows
            .iter()
            .filter(|row| row.state == LockState::Held)
            .collect()
    }

    /// Whether the table knows the semaphore: a number of permits recorded, or a permit's row.
    pub fn exists(&self) -> bool {
        self.permits.is_some() || !self.rows.is_empty()
    }
}

/// The status of semaphore `name` (`LockRegistry::semaphore_status`).
pub(crate) fn status(core: &Arc<Core>, name: &str) -> Result<SemaphoreStatus> {
    crate::key::validate_key(name)?;
    let deadline = Instant::now() + core.settings.operation_timeout;
    let recorded = core
        .store
        .recorded_permits(&crate::key::lock_key_for(name), deadline)?;
    // "…#" sorts just before slot 000, and every slot's key starts with it.
    let prefix = slot_lock_key(name, 0)[..33].to_string();
    let rows = crate::admin::Listing::new(core)
        .page(Some(&prefix), MAX_PERMITS as usize)?
        .into_iter()
        .filter(|row| row.lock_key.starts_with(&prefix))
        .map(|mut row| {
            row.name = Some(name.to_string());
            row
        })
        .collect();
    Ok(SemaphoreStatus {
        permits: recorded.and_then(|permits| u32::try_from(permits).ok()),
        rows,
    })
}

/// How long an acquire may wait for a permit.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// One round over the slots.
    No,
    /// Until the instant.
    Until(Instant),
    /// Until granted.
    Forever,
}

impl Wait {
    /// Whether a wait until a deadline is over at `now`.
    fn over(self, now: Instant) -> bool {
        matches!(self, Wait::Until(deadline) if deadline <= now)
    }
}

struct LocalState {
    /// The thread trying the slots, or sleeping until its next round, if any.
    poller: Option<ThreadId>,
    /// A permit was released here, or a release elsewhere was notified: poll now.
    nudged: bool,
    /// Where the next round starts.
    next_slot: usize,
    /// When a round last found every permit held. A waiter that took over polling from
    /// another thread knows from it that the permits were held during its wait.
    refused_at: Option<Instant>,
    /// When a round of this registry last had an answer from the database (a permit held, or
    /// granted). A bounded wait whose time runs out after it reports "not granted in time".
    answered_at: Option<Instant>,
    /// Whether the last round of this registry found every permit held: a thread that waits
    /// for the poller meanwhile waits for a semaphore found taken.
    all_held: bool,
    /// Threads waiting on the condition variable between tries (the sleeping poller
    /// included): the ones that can take an offered permit.
    parked: usize,
    /// Slots whose holders wait for a parked thread to claim them (see "Handoff").
    offers: Vec<u32>,
    /// Slots claimed by a thread that has not yet come back from queueing on the slot's lock:
    /// while one is here, its holder waits for the claimant to queue.
    claiming: Vec<u32>,
}

/// Shared state of one semaphore in one registry.
pub(crate) struct SemaphoreInner {
    name: Arc<str>,
    permits: u32,
    /// One lock handle per slot, on the slot's row.
    slots: Vec<Lock>,
    /// The slots' `LOCK_KEY`s, as release wake-ups know them.
    slot_keys: Vec<Arc<str>>,
    core: Arc<Core>,
    state: Mutex<LocalState>,
    changed: Condvar,
}

impl SemaphoreInner {
    fn new(name: &str, permits: u32, core: &Arc<Core>, rows: &mut RowStates) -> Self {
        let slot_keys: Vec<Arc<str>> = (0..permits)
            .map(|slot| slot_lock_key(name, slot).into())
            .collect();
        let slots = slot_keys
            .iter()
            .map(|lock_key| {
                Lock::new(rows.get_or_make(lock_key, || {
                    LockInner::with_lock_key(name, lock_key.to_string(), Arc::clone(core)).tracked()
                }))
            })
            .collect();
        SemaphoreInner {
            name: name.into(),
            permits,
            slots,
            slot_keys,
            core: Arc::clone(core),
            state: Mutex::new(LocalState {
                poller: None,
                nudged: false,
                // Registries start at different slots, so that they rarely try the same row.
                next_slot: (uuid::Uuid::new_v4().as_u128() % u128::from(permits)) as usize,
                refused_at: None,
                answered_at: None,
                all_held: false,
                parked: 0,
                offers: Vec::new(),
                claiming: Vec::new(),
            }),
            changed: Condvar::new(),
        }
    }

    fn acquire(self: &Arc<Self>, wait: Wait, ttl: Duration) -> Result<Option<Permit>> {
        self.core.settings.check_ttl("time_to_live", ttl)?;
        let me = std::thread::current().id();
        let as_poller = Arc::downgrade(self) as Weak<dyn Nudge>;
        let mut registered = false;
        let mut state = self.state.lock();
        // Unwind-safe: whatever panics inside (a bug, a fail point), this thread stops being
        // the poller and unregisters.
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
            self.acquire_locked(&mut state, me, wait, ttl, &as_poller, &mut registered)
        }));
        if state.poller == Some(me) {
            state.poller = None;
        }
        drop(state);
        if registered {
            for lock_key in &self.slot_keys {
                self.core.wakeups.unregister(lock_key, &as_poller);
            }
        }
        // Another waiter may have to poll now.
        self.changed.notify_all();
        outcome.unwrap_or_else(|panic| panic::resume_unwind(panic))
    }

    fn acquire_locked(
        self: &Arc<Self>,
        state: &mut MutexGuard<'_, LocalState>,
        me: ThreadId,
        wait: Wait,
        ttl: Duration,
        as_poller: &Weak<dyn Nudge>,
        registered: &mut bool,
    ) -> Result<Option<Permit>> {
        // Whether an attempt of this wait found a permit held.
        let mut refused = false;
        // Whether this wait has looked at the permits: a round of its own, or a wait while
        // another thread of this registry polled.
        let mut looked = false;
        let mut patience = Patience::new(&self.core.settings);
        let waiting_since = Instant::now();
        loop {
            if let Some(permit) = self.claim(state, wait, ttl)? {
                return Ok(Some(permit));
            }
            self.core.check_open()?;
            if looked && wait.over(Instant::now()) {
                // No round starts after the deadline.
                return Ok(None);
            }
            if state.poller.is_none() {
                if !matches!(wait, Wait::No) && !*registered {
                    let count = self.slot_keys.len();
                    let watched = match self.core.store.listener_watches_keys().is_some() {
                        true => count.min(KEYED_WATCHES),
                        false => count,
                    };
                    for offset in 0..watched {
                        let lock_key = &self.slot_keys[(state.next_slot + offset) % count];
                        *registered |= self.core.wakeups.register(lock_key, Weak::clone(as_poller));
                    }
                }
                state.poller = Some(me);
                state.nudged = false;
                let start = state.next_slot;
                let deadline = match wait {
                    Wait::Until(deadline) => Some(deadline),
                    _ => None,
                };
                let round = MutexGuard::unlocked(state, || {
                    self.round(start, ttl, deadline, &mut refused, &mut patience)
                });
                looked = true;
                patience.round_over(&self.core.settings);
                // An attempt of this wait (this thread's, or that of the poller it took over
                // from) found permits held, or another thread's round had an answer.
                refused |= state.refused_at.is_some_and(|at| at >= waiting_since)
                    || state.answered_at.is_some_and(|at| at >= waiting_since);
                let round = match round {
                    // The database answered during this wait and the caller's time ran out on
                    // this attempt (often waiting for a pooled connection): "not granted in
                    // time".
                    Err(Error::Timeout { .. }) if refused && deadline.is_some() => return Ok(None),
                    other => other?,
                };
                state.answered_at = Some(Instant::now());
                state.all_held = round.is_none();
                if let Some(permit) = round {
                    state.next_slot = (permit.slot as usize + 1) % self.slots.len();
                    return Ok(Some(permit));
                }
                state.refused_at = Some(Instant::now());
                let next_poll = Instant::now() + self.core.settings.idle_between_tries;
                let wake_at = match wait {
                    Wait::No => return Ok(None),
                    Wait::Until(deadline) if deadline <= Instant::now() => return Ok(None),
                    Wait::Until(deadline) => next_poll.min(deadline),
                    Wait::Forever => next_poll,
                };
                self.core.wakeups.before_sleep();
                state.parked += 1;
                // An offered permit wakes the poller only when no other parked thread can
                // claim it: a poller that lost the race would start a round.
                while Instant::now() < wake_at
                    && !state.nudged
                    && !self.core.is_closed()
                    && (state.offers.is_empty() || state.parked > 1)
                {
                    self.changed.wait_until(state, wake_at);
                }
                state.parked -= 1;
                state.poller = None;
                if deadline.is_some_and(|deadline| deadline <= Instant::now()) {
                    return Ok(None);
                }
                continue;
            }
            if matches!(wait, Wait::No) {
                return Ok(None);
            }
            if wait.over(Instant::now()) {
                return Ok(None);
            }
            refused |= state.all_held;
            state.parked += 1;
            match wait {
                Wait::Until(deadline) => {
                    self.changed.wait_until(state, deadline);
                }
                _ => self.changed.wait(state),
            }
            state.parked -= 1;
            looked = true;
        }
    }

    /// Takes a slot offered by a releasing thread of this registry, if there is one and the
    /// wait is not over: queues on the slot's lock, which its holder then hands over (see
    /// "Handoff"). `None` when nothing was offered, or the handoff did not happen (the holder's
    /// turn was over, say), so the caller goes on waiting as before.
    fn claim(
        self: &Arc<Self>,
        state: &mut MutexGuard<'_, LocalState>,
        wait: Wait,
        ttl: Duration,
    ) -> Result<Option<Permit>> {
        let now = Instant::now();
        if matches!(wait, Wait::No) || wait.over(now) {
            return Ok(None);
        }
        let Some(slot) = state.offers.pop() else {
            return Ok(None);
        };
        self.changed.notify_all();
        // A handoff comes whenever this thread wakes, whatever the deadline (the lock gives it
        // ownership before waking it). Without one (the holder's turn was over), the lock
        // tries the slot's row from the database once local threads may poll again, for a
        // short while only: then back to the semaphore's rounds, which try every slot.
        let settings = &self.core.settings;
        let statement = (settings.idle_between_tries * 4).max(Duration::from_millis(100));
        let bound = now + settings.turn_gap() + settings.idle_between_tries + statement;
        let deadline = match wait {
            Wait::Until(deadline) => deadline.min(bound),
            _ => bound,
        };
        let lock = &self.slots[slot as usize];
        state.claiming.push(slot);
        let taken = MutexGuard::unlocked(state, || {
            // `return`: as a claimant whose wait ran out on the way in, and whose brief stay
            // in the slot's queue its holder did not see.
            fail_point!("semaphore::claim_before_lock", |_| Ok(None));
            lock.try_lock_until_with_ttl(deadline, ttl)
        });
        if let Some(position) = state.claiming.iter().position(|claimed| *claimed == slot) {
            state.claiming.remove(position);
        }
        let guard = match taken {
            // That try ran out of its short time: the rounds go on (as after any refusal).
            Err(Error::Timeout { .. }) => None,
            other => other?,
        };
        Ok(guard.map(|guard| Permit {
            semaphore: Arc::clone(self),
            slot,
            guard: Some(guard),
        }))
    }

    /// Hands `guard`'s slot to a parked thread of this registry if one claims it: returns
    /// `true` once the claimant queues on the slot's lock (the release that follows hands the
    /// lease over), `false` at once when there is nobody to hand it to (see "Handoff").
    fn offer<H: Holding>(&self, slot: u32, guard: &LockGuard<H>) -> bool {
        if !self.core.settings.local_handoff || !guard.is_held() {
            return false;
        }
        let mut state = self.state.lock();
        if state.parked == 0 {
            return false;
        }
        state.offers.push(slot);
        self.changed.notify_all();
        // Only a bug could keep a parked thread from claiming or leaving; bounded anyway.
        let give_up = Instant::now() + self.core.settings.operation_timeout;
        while state.offers.contains(&slot) && state.parked > 0 && Instant::now() < give_up {
            self.changed.wait_until(&mut state, give_up);
        }
        if let Some(position) = state.offers.iter().position(|offered| *offered == slot) {
            // Nobody claimed it: the release goes to the database.
            state.offers.remove(position);
            return false;
        }
        drop(state);
        // Wait for the claimant to queue on the slot's lock. It may leave without ever being
        // seen there (its wait ran out on the way in, or it queued and left again): then the
        // release goes to the database, as if nobody had claimed.
        let lock = &self.slots[slot as usize];
        loop {
            if lock.queued_threads() > 0 {
                return true;
            }
            if !self.state.lock().claiming.contains(&slot) || Instant::now() >= give_up {
                return lock.queued_threads() > 0;
            }
            std::thread::yield_now();
        }
    }

    /// One try of every slot, from `start` on: the first permit granted, or none. Each
    /// statement gives up at `deadline` if there is one (else after `operation_timeout`), and
    /// no statement starts after it. Sets `refused` when a slot was held.
    fn round(
        self: &Arc<Self>,
        start: usize,
        ttl: Duration,
        deadline: Option<Instant>,
        refused: &mut bool,
        patience: &mut Patience,
    ) -> Result<Option<Permit>> {
        let count = self.slots.len();
        for offset in 0..count {
            if offset > 0 && deadline.is_some_and(|deadline| deadline <= Instant::now()) {
                return Ok(None);
            }
            let slot = (start + offset) % count;
            let lock = &self.slots[slot];
            if lock.is_held_by_current_thread() {
                continue;
            }
            match patience.try_row(lock, &self.core.settings, deadline, ttl)? {
                Some(guard) => {
                    return Ok(Some(Permit {
                        semaphore: Arc::clone(self),
                        slot: slot as u32,
                        guard: Some(guard),
                    }))
                }
                None => *refused = true,
            }
        }
        Ok(None)
    }

    /// A permit of this registry went back: the poller should look again now.
    fn released(&self) {
        self.state.lock().nudged = true;
        self.changed.notify_all();
    }
}

impl Nudge for SemaphoreInner {
    /// Called by the release listener: a slot was released elsewhere, poll now.
    fn nudge(&self) {
        self.released();
    }
}

/// A handle on one counting semaphore of a registry (see [`LockRegistry::semaphore`](crate::LockRegistry::semaphore)). Cheap
/// to clone; all handles of one name in one registry share one poller.
///
/// A waiting acquire polls the database every `idle_between_tries` while every permit is
/// held, waking at once when a permit of this registry is released (a waiting thread of this
/// registry is handed it without a statement, see [`Permit::fencing_token`]) or another
/// instance's release is notified; it returns `Err` only when the input is bad or the database keeps
/// failing. A thread that already holds permits may take another; with every other permit
/// held, by anyone, it waits (a permit is not reentrant).
pub struct Semaphore<H: Holding = ThisThread> {
    inner: Arc<SemaphoreInner>,
    _holder: PhantomData<fn() -> H>,
}

impl<H: Holding> Clone for Semaphore<H> {
    fn clone(&self) -> Self {
        Semaphore {
            inner: Arc::clone(&self.inner),
            _holder: PhantomData,
        }
    }
}

impl<H: Holding> Semaphore<H> {
    /// The same semaphore, whose permits belong to no thread: `Send` and `Sync` (see
    /// [`AnyThread`]).
    pub fn any_thread(&self) -> Semaphore<AnyThread> {
        Semaphore {
            inner: Arc::clone(&self.inner),
            _holder: PhantomData,
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How many holders it allows at once, across all instances.
    pub fn permits(&self) -> u32 {
        self.inner.permits
    }

    /// How many threads of this registry wait for a permit of it between their tries (the
    /// ones a permit released here is handed to without a statement).
    pub fn waiting_threads(&self) -> usize {
        self.inner.state.lock().parked
    }

    acquire_methods!(
        "a permit",
        Permit,
        acquire,
        acquire,
        acquire_with_ttl,
        try_acquire,
        try_acquire_with_ttl,
        try_acquire_for,
        try_acquire_for_with_ttl,
        try_acquire_until,
        try_acquire_until_with_ttl
    );
}

impl<H: Holding> std::fmt::Debug for Semaphore<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.name)
            .field("permits", &self.inner.permits)
            .finish()
    }
}

/// One permit of a semaphore, held by the current thread; released when dropped.
///
/// Its lease is renewed in the background, lost alone and reported alone, like a
/// [`LockGuard`]'s, whose methods it has. Dropping releases on a best-effort basis and logs
/// failures; [`unlock`](Self::unlock) returns them. It stays on its thread, like a lock guard,
/// unless taken through [`Semaphore::any_thread`].
#[must_use = "if unused the permit is released at once"]
pub struct Permit<H: Holding = ThisThread> {
    semaphore: Arc<SemaphoreInner>,
    slot: u32,
    /// `None` once released.
    guard: Option<LockGuard<H>>,
}

impl Permit {
    /// This permit, taken for this thread, as one of kind `H`.
    fn holding<H: Holding>(mut self) -> Permit<H> {
        Permit {
            semaphore: Arc::clone(&self.semaphore),
            slot: self.slot,
            guard: self.guard.take().map(LockGuard::holding),
        }
    }
}

impl<H: Holding> Permit<H> {
    lease_guard_methods!(semaphore);

    /// Which of the semaphore's permits this is, from 0 to `permits - 1`: no two holders
    /// anywhere hold the same slot at once.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The fencing token of this permit's grant: larger than every earlier grant of the same
    /// [`slot`](Self::slot) (tokens of different slots are unrelated). A resource that admits
    /// N writers can keep the largest token seen per slot and refuse smaller ones. A permit
    /// handed over from another thread of this registry keeps the grant and its token, as a
    /// lock's handoff does; [`Tuning::local_handoff`](crate::Tuning::local_handoff) `false`
    /// gives every holder a grant of its own.
    pub fn fencing_token(&self) -> u64 {
        self.lease_guard().fencing_token()
    }

    /// Releases the permit and reports whether the lease was still held until then:
    /// `Err(LeaseLost)` means more holders than permits may have run meanwhile.
    pub fn unlock(mut self) -> Result<()> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        let handed = self.semaphore.offer(self.slot, &guard);
        let released = guard.unlock();
        if !handed {
            self.semaphore.released();
        }
        released
    }
}

impl<H: Holding> Drop for Permit<H> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            let handed = self.semaphore.offer(self.slot, &guard);
            drop(guard);
            if !handed {
                self.semaphore.released();
            }
        }
    }
}

impl<H: Holding> std::fmt::Debug for Permit<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("name", &self.semaphore.name)
            .field("slot", &self.slot)
            .field("guard", &self.guard)
            .finish()
    }
}
