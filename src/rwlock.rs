//! Reader/writer locks: many readers or one writer across every instance, each hold a lease of
//! its own, and a waiting writer stops new readers from entering.
//!
//! # Storage: lock rows, as for semaphores
//!
//! A reader/writer lock `name` is [`MAX_READERS`] *read slots*, eight *claim rows*
//! and one *write row*, each an ordinary lease row of the lock table (taken, renewed, released,
//! fenced and expired by the lock statements). Their `LOCK_KEY`s are the 32 hexadecimal digits
//! of the name's UUID, then `@r00` … `@r63` for the read slots, `@v00` … `@v07` for the claim
//! rows and `@w00` for the write row: 36 characters, never a UUID, so neither Spring
//! Integration nor a plain lock or a semaphore (`#`) of leasehold can name one. The rows of one
//! lock sort together, so one listing statement reads the read slots, and one the claim rows
//! with the write row.
//!
//! # The protocol
//!
//! - **A reader** checks that no writer holds or claims the lock (one listing of the claim
//!   rows and the write row), takes a free read slot (one acquire, as a semaphore's permit),
//!   and checks the write row again (one read). If a writer holds or claims the lock at the
//!   first check, or holds the write row at the second, the reader lets its slot go (if it has
//!   one) and waits until the write row is free, polling every `idle_between_tries` (woken at
//!   once by the write row's release, as a lock's waiter is).
//! - **A writer** takes the write row (as a lock, waiting like one), which from then on keeps
//!   new readers out, and then waits until no read slot is held on the database clock (one
//!   listing per poll, woken by a read slot's release). Then it takes its token (see
//!   *Fencing*) and holds the lock.
//!
//! Each side writes its own row and then reads the other's, each statement in a transaction of
//! its own: if the reader's second check does not see the writer's row, the writer's grant
//! committed after that check began, so the writer's listing, which follows its grant, sees the
//! reader's slot. So a reader and a writer never both hold the lock; at worst both back off
//! (the reader lets go, the writer waits for it) and the writer gets in.
//!
//! **Bounded waits** (`try_read_for`, `try_write_until`, …) return `Ok(None)` when the side
//! was not granted in time, [`Error::Timeout`] only when no statement of the wait had an answer
//! from the database. A read slot or claim row that another session holds locked costs only
//! that row: a reader passes over it as a semaphore's poller passes over a permit's row (see
//! `crate::semaphore`, "A row that does not answer"), and so does a writer taking its token
//! (see *Fencing*).
//!
//! # Writer preference
//!
//! A writer's *claim* is the write row, or, while another writer has the write row, a claim row: a
//! writer that finds the write row taken takes a free claim row at once and keeps it until it has
//! the write row or its own wait ends. Readers check for both before they take a slot, so from the
//! moment a writer holds its claim, new readers of every instance stay out as long as any writer
//! waits or writes: a writer whose timed wait ends lets its claim go, but every other waiting
//! writer still holds its own, and the write row goes to one of them. A waiting writer's rows are
//! renewed in the background like any lease; a claim that runs out while its writer waits (the
//! process was paused past the time-to-live) was never a grant, and the writer claims again within
//! the same wait.
//!
//! The bound: **once a blocking `write()` holds its claim, it waits only for the readers in at that
//! moment (those past their first check included) to leave and for the writes of the writers that
//! get the write row before it; no other reader enters meanwhile, and a writer that times out while
//! it holds the write row delays it by at most one poll (`idle_between_tries`; none when the
//! release wakes it, or when both are threads of one registry and the write row passes between
//! them).** A stream of readers therefore cannot starve a writer, nor can a stream of writers that
//! time out. Writers of different instances take the write row in no particular order (each polls).
//! When more than eight writers wait at once, the others wait without a claim row of their own (the
//! claims of the first keep readers out meanwhile).
//!
//! # Fencing
//!
//! A write guard's token is a grant of its own. Once the listing finds no read slot held, the
//! writer (which holds the write row, so no reader keeps a slot it takes meanwhile) takes one
//! read slot and lets it go at once, and keeps that grant's token only if it is above the
//! largest token among the read slots' rows in that listing. Every earlier read grant and
//! every earlier write token (each of which is such a grant) is either at most that largest
//! token or was in a row deleted since, and every grant is above the deletion floor, so above
//! the token of every row deleted since (see "Fencing tokens" in the crate docs): the write
//! token is above every earlier read and write grant, whatever rows were deleted, on any
//! database and whatever its clock did.
//!
//! Which slot: first the row (or rows) that carries the largest token, whose grant is above
//! it by construction; when that row is held or does not answer — another session holds it
//! locked, as an operator's `SELECT … FOR UPDATE` or an expired reader's fenced transaction
//! still open does, and PostgreSQL and MariaDB refuse such a row within milliseconds — the
//! other slots with a row, larger tokens first, then those without one, up to the first
//! grant. A grant takes at least the database clock's reading, so any slot's grant is above
//! the largest token once the database clock has passed it, which it has unless the clock
//! was set back or the grants came quicker than its tick (SQLite's counts milliseconds; there
//! no session locks single rows). A grant that is not above it is let go, and the writer
//! polls again.
//!
//! The bound: **each read slot row the writer tries and finds locked costs that write one
//! refused statement (on MySQL, whose acquire waits up to 1 s for a locked row, one share of
//! the row poller's patience, after which the registry's writes pass over that row for a
//! while, as a semaphore's poller does); a writer waits for a locked row only while every row
//! that carries the largest token is locked and the database clock reads below that token,
//! until one of those rows answers or the clock passes the token.** Besides those refused,
//! the token costs two statements (the grant and its release) per write hold, a local handoff
//! between writers of one registry included: every write hold has a token of its own. The write token is the larger
//! of that grant's token and the write row's own; tokens are only ever compared, never added.
//! A read guard's token is its slot's grant: above every earlier grant of its slot, and below
//! every later write token. The table shows the rows' own tokens.
//!
//! # Threads of one registry
//!
//! Each [`RwLock`] handle points at one `RwInner` per (registry, name). Writers of one registry
//! queue on the write row's local lock (handing it over without a statement, as a lock does).
//! While a thread of the registry wants or holds the write side, the registry's new readers wait
//! in-process without a statement, so they never take a slot only to let it go. Every reader
//! takes a slot of its own (a read hold is its own lease).
//!
//! # Not supported
//!
//! Upgrades and downgrades: a thread that holds the read side and asks for the write side (or
//! the other way round) waits for itself until its deadline. More than [`MAX_READERS`] readers
//! at once: the others wait for a slot.

use crate::admin::{LockRow, LockState};
use crate::backend::{ListedRow, STATE_HELD};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::lock::{
    AnyThread, Holding, Lock, LockGuard, LockInner, Patience, RowStates, ThisThread,
};
use crate::wakeups::Nudge;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How many readers a reader/writer lock admits at once (its read slots).
pub const MAX_READERS: u32 = 64;

/// How many writers waiting for the write row keep readers out with a claim row of their own
/// (see "Writer preference" in the module docs).
const WRITE_CLAIMS: u32 = 8;

/// The hexadecimal digits of `name`'s UUID, the stem of its read and write rows.
fn stem(name: &str) -> String {
    crate::key::lock_key_for(name)
        .chars()
        .filter(|c| *c != '-')
        .collect()
}

/// The live reader/writer locks of one registry, by name, and the states of their rows.
#[derive(Default)]
pub(crate) struct RwLockCache {
    live: HashMap<String, Weak<RwInner>>,
    rows: RowStates,
}

/// The reader/writer lock `name` of the registry with this core and cache (`LockRegistry::rw_lock`).
pub(crate) fn obtain(
    core: &Arc<Core>,
    rw_locks: &Mutex<RwLockCache>,
    name: &str,
) -> Result<RwLock> {
    crate::key::validate_key(name)?;
    let mut cache = rw_locks.lock();
    if let Some(inner) = cache.live.get(name).and_then(Weak::upgrade) {
        return Ok(RwLock {
            inner,
            _holder: PhantomData,
        });
    }
    let inner = Arc::new(RwInner::new(name, core, &mut cache.rows));
    let waitable: Weak<dyn Nudge> = Arc::downgrade(&inner) as Weak<dyn Nudge>;
    core.track(waitable);
    cache.live.retain(|_, known| known.strong_count() > 0);
    cache.live.insert(name.to_string(), Arc::downgrade(&inner));
    Ok(RwLock {
        inner,
        _holder: PhantomData,
    })
}

/// What the table says about a reader/writer lock, for operators: see
/// [`LockRegistry::rw_lock_status`](crate::LockRegistry::rw_lock_status).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwLockStatus {
    /// The rows of its read slots in slot order — held, expired and released — each named
    /// with the lock's name. A slot never taken has no row.
    pub readers: Vec<LockRow>,
    /// The write row, if it has one.
    pub writer: Option<LockRow>,
}

impl RwLockStatus {
    /// The read holds now (judged on the database clock by the listing): one row per reader.
    pub fn held_readers(&self) -> Vec<&LockRow> {
        self.readers
            .iter()
            .filter(|row| row.state == LockState::Held)
            .collect()
    }

    /// The write row when it is held now: by the writer, or, while
    /// [`held_readers`](Self::held_readers) is not empty, by a writer waiting for those readers
    /// to leave (it keeps new readers out meanwhile).
    pub fn held_writer(&self) -> Option<&LockRow> {
        self.writer
            .as_ref()
            .filter(|row| row.state == LockState::Held)
    }

    /// Whether the table has any row of the lock.
    pub fn exists(&self) -> bool {
        self.writer.is_some() || !self.readers.is_empty()
    }
}

/// The status of reader/writer lock `name` (`LockRegistry::rw_lock_status`).
pub(crate) fn status(core: &Arc<Core>, name: &str) -> Result<RwLockStatus> {
    crate::key::validate_key(name)?;
    let prefix = format!("{}@", stem(name));
    let (read_prefix, write_key) = (format!("{prefix}r"), format!("{prefix}w00"));
    let mut status = RwLockStatus {
        readers: Vec::new(),
        writer: None,
    };
    // "…@" sorts before the read slots (`@r…`), they before the claim rows of waiting
    // writers (`@v…`), and those before the write row (`@w00`).
    let rows = crate::admin::Listing::new(core)
        .page(Some(&prefix), (MAX_READERS + WRITE_CLAIMS) as usize + 1)?;
    for mut row in rows {
        row.name = Some(name.to_string());
        if row.lock_key.starts_with(&read_prefix) {
            status.readers.push(row);
        } else if row.lock_key == write_key {
            status.writer = Some(row);
        }
    }
    Ok(status)
}

/// How long an acquire may wait.
#[derive(Clone, Copy, Debug)]
enum Wait {
    No,
    Until(Instant),
    Forever,
}

impl Wait {
    fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until(deadline) => Some(deadline),
            _ => None,
        }
    }

    /// Whether the wait is over at `now`.
    fn over(self, now: Instant) -> bool {
        match self {
            Wait::No => true,
            Wait::Until(deadline) => deadline <= now,
            Wait::Forever => false,
        }
    }
}

struct LocalState {
    /// Threads of this registry inside a write acquire or holding a write guard.
    writers: usize,
    /// Counts the holds of this registry that ended and the releases notified from elsewhere:
    /// a poller that saw it change since its last look polls now.
    nudges: u64,
}

/// Shared state of one reader/writer lock in one registry.
pub(crate) struct RwInner {
    name: Arc<str>,
    core: Arc<Core>,
    writer: Lock,
    writer_key: Arc<str>,
    readers: Vec<Lock>,
    reader_keys: Vec<Arc<str>>,
    /// What every read slot's `LOCK_KEY` starts with (and sorts after).
    reader_prefix: String,
    /// The claim rows of writers waiting for the write row.
    claims: Vec<Lock>,
    /// What every claim row's `LOCK_KEY` starts with (and sorts after); the write row sorts
    /// right after the claim rows.
    claim_prefix: String,
    /// How the write token tries the read slots, kept from one write hold of this registry to
    /// the next, so that a slot whose row did not answer is passed over for a while (see
    /// [`Patience`]). Only a thread that holds the write row locks it.
    token_patience: Mutex<Patience>,
    state: Mutex<LocalState>,
    changed: Condvar,
}

impl RwInner {
    fn new(name: &str, core: &Arc<Core>, rows: &mut RowStates) -> Self {
        let stem = stem(name);
        let mut row = |lock_key: &str, reported: bool| {
            Lock::new(rows.get_or_make(lock_key, || {
                let inner = LockInner::with_lock_key(name, lock_key.to_string(), Arc::clone(core));
                match reported {
                    true => inner.tracked(),
                    false => inner.unreported().tracked(),
                }
            }))
        };
        let writer_key: Arc<str> = format!("{stem}@w00").into();
        let reader_keys: Vec<Arc<str>> = (0..MAX_READERS)
            .map(|slot| format!("{stem}@r{slot:02}").into())
            .collect();
        RwInner {
            name: name.into(),
            core: Arc::clone(core),
            // Claims, and the write row until the write side is granted, are not the user's
            // grant: a loss of theirs is not reported (see `write_loop`).
            writer: row(&writer_key, false),
            readers: reader_keys.iter().map(|key| row(key, true)).collect(),
            writer_key,
            reader_keys,
            reader_prefix: format!("{stem}@r"),
            claims: (0..WRITE_CLAIMS)
                .map(|claim| row(&format!("{stem}@v{claim:02}"), false))
                .collect(),
            claim_prefix: format!("{stem}@v"),
            token_patience: Mutex::new(Patience::new(&core.settings)),
            state: Mutex::new(LocalState {
                writers: 0,
                nudges: 0,
            }),
            changed: Condvar::new(),
        }
    }

    fn as_poller(self: &Arc<Self>) -> Weak<dyn Nudge> {
        Arc::downgrade(self) as Weak<dyn Nudge>
    }

    /// The deadline of one statement of an acquire.
    fn statement_deadline(&self, wait: Wait) -> Instant {
        let now = Instant::now();
        match wait {
            Wait::Until(deadline) => deadline.max(now + Duration::from_millis(1)),
            _ => now + self.core.settings.operation_timeout,
        }
    }

    /// The nudge count now: taken before a look at the database, so that a release that
    /// comes while the statement runs cuts the sleep after it short.
    fn nudges(&self) -> u64 {
        self.state.lock().nudges
    }

    /// Sleeps until the next poll (or the deadline), cut short by a nudge since `seen` (see
    /// [`Self::nudges`]); `false` when the wait is over.
    fn sleep_between_polls(&self, wait: Wait, seen: u64) -> bool {
        let now = Instant::now();
        if wait.over(now) {
            return false;
        }
        let next_poll = now + self.core.settings.idle_between_tries;
        let wake_at = wait.deadline().map_or(next_poll, |d| d.min(next_poll));
        self.core.wakeups.before_sleep();
        let mut state = self.state.lock();
        while Instant::now() < wake_at && state.nudges == seen && !self.core.is_closed() {
            self.changed.wait_until(&mut state, wake_at);
        }
        !wait.over(Instant::now())
    }

    /// `outcome` of a wait. A timeout of a bounded wait in which the database had answered
    /// (`answered`: the lock was found taken, or a statement of the wait returned) means "not
    /// granted in time" (often a statement waiting for a pooled connection, or the last
    /// statement started just before the deadline): `Ok(None)`. Only a bounded wait that never
    /// had an answer reports the timeout.
    fn timed_out_as_none<T>(
        wait: Wait,
        answered: bool,
        outcome: Result<Option<T>>,
    ) -> Result<Option<T>> {
        match outcome {
            Err(Error::Timeout { .. }) if answered && wait.deadline().is_some() => Ok(None),
            other => other,
        }
    }

    /// Whether the write row is held on the database clock (by anyone, this registry too): one
    /// primary-key read.
    fn write_row_held(&self, wait: Wait) -> Result<bool> {
        let deadline = self.statement_deadline(wait);
        Ok(self
            .core
            .store
            .holder(&self.writer_key, deadline)?
            .is_some())
    }

    /// Whether a writer holds or waits for the lock: the write row or a claim row held on
    /// the database clock (by anyone, this registry too). One listing: the claim rows and the
    /// write row sort together.
    fn claimed(&self, wait: Wait) -> Result<bool> {
        let deadline = self.statement_deadline(wait);
        let rows =
            self.core
                .store
                .list(&self.claim_prefix, i64::from(WRITE_CLAIMS) + 1, deadline)?;
        Ok(rows.iter().any(|row| {
            row.state == STATE_HELD
                && (row.lock_key.starts_with(&*self.claim_prefix)
                    || *row.lock_key == *self.writer_key)
        }))
    }

    fn read(self: &Arc<Self>, wait: Wait, ttl: Duration) -> Result<Option<ReadGuard>> {
        self.core.settings.check_ttl("time_to_live", ttl)?;
        let poller = self.as_poller();
        let wakeups = &self.core.wakeups;
        // Readers wait for the write row; a reader that finds every read slot taken polls.
        let registered =
            !matches!(wait, Wait::No) && wakeups.register(&self.writer_key, Weak::clone(&poller));
        let mut answered = false;
        let outcome = self.read_loop(wait, ttl, &mut answered);
        let outcome = Self::timed_out_as_none(wait, answered, outcome);
        if registered {
            wakeups.unregister(&self.writer_key, &poller);
        }
        outcome
    }

    fn read_loop(
        self: &Arc<Self>,
        wait: Wait,
        ttl: Duration,
        answered: &mut bool,
    ) -> Result<Option<ReadGuard>> {
        let start = (uuid::Uuid::new_v4().as_u128() % u128::from(MAX_READERS)) as usize;
        let mut patience = Patience::new(&self.core.settings);
        loop {
            self.core.check_open()?;
            {
                let mut state = self.state.lock();
                while state.writers > 0 {
                    self.core.check_open()?;
                    // A writer of this registry has the lock or waits for it.
                    *answered = true;
                    match wait {
                        Wait::No => return Ok(None),
                        Wait::Until(deadline) => {
                            if self.changed.wait_until(&mut state, deadline).timed_out() {
                                return Ok(None);
                            }
                        }
                        Wait::Forever => self.changed.wait(&mut state),
                    }
                }
            }
            let seen = self.nudges();
            let held = self.claimed(wait)?;
            *answered = true;
            if held {
                if !self.sleep_between_polls(wait, seen) {
                    return Ok(None);
                }
                continue;
            }
            let taken = self.take_read_slot(start, wait, ttl, &mut patience)?;
            patience.round_over(&self.core.settings);
            let Some((slot, guard)) = taken else {
                if !self.sleep_between_polls(wait, seen) {
                    return Ok(None);
                }
                continue;
            };
            if self.write_row_held(wait)? {
                // A writer came in between: let it have the lock.
                drop(guard);
                if !self.sleep_between_polls(wait, seen) {
                    return Ok(None);
                }
                continue;
            }
            return Ok(Some(ReadGuard {
                lock: Arc::clone(self),
                slot,
                guard: Some(guard),
            }));
        }
    }

    /// One try of every read slot, from `start` on, skipping this thread's own; a slot whose
    /// row does not answer within its share of the wait (another session holds it locked) is
    /// passed over like a held one (see [`Patience`]).
    fn take_read_slot(
        &self,
        start: usize,
        wait: Wait,
        ttl: Duration,
        patience: &mut Patience,
    ) -> Result<Option<(u32, LockGuard)>> {
        let count = self.readers.len();
        for offset in 0..count {
            if offset > 0 && wait.deadline().is_some_and(|d| d <= Instant::now()) {
                return Ok(None);
            }
            let slot = (start + offset) % count;
            let lock = &self.readers[slot];
            if lock.is_held_by_current_thread() {
                continue;
            }
            if let Some(guard) =
                patience.try_row(lock, &self.core.settings, wait.deadline(), ttl)?
            {
                return Ok(Some((slot as u32, guard)));
            }
        }
        Ok(None)
    }

    fn write(self: &Arc<Self>, wait: Wait, ttl: Duration) -> Result<Option<WriteGuard>> {
        self.core.settings.check_ttl("time_to_live", ttl)?;
        self.state.lock().writers += 1;
        let poller = self.as_poller();
        // The read slots it has seen held, registered for wake-ups (not all of them; on MySQL
        // only the first few found held, as each costs a watcher's connection while it waits).
        let mut watched = vec![false; self.reader_keys.len()];
        let mut answered = false;
        let outcome = self.write_loop(wait, ttl, &poller, &mut watched, &mut answered);
        let outcome = Self::timed_out_as_none(wait, answered, outcome);
        for (key, _) in self.reader_keys.iter().zip(&watched).filter(|(_, w)| **w) {
            self.core.wakeups.unregister(key, &poller);
        }
        match outcome {
            Ok(Some((guard, token))) => Ok(Some(WriteGuard {
                lock: Arc::clone(self),
                guard: Some(guard),
                token,
            })),
            other => {
                self.writer_left();
                other.map(|_| None)
            }
        }
    }

    /// Takes the write row (the claim), then waits for the readers to leave; the row's guard
    /// and the write token once the write side is held. A claim that runs out while it waits
    /// (the process was paused past its time-to-live) was never a grant: the writer claims
    /// again, within the same wait.
    fn write_loop(
        &self,
        wait: Wait,
        ttl: Duration,
        poller: &Weak<dyn Nudge>,
        watched: &mut [bool],
        answered: &mut bool,
    ) -> Result<Option<(LockGuard, u64)>> {
        'claim: loop {
            let Some(guard) = self.take_write_row(wait, ttl, answered)? else {
                return Ok(None);
            };
            loop {
                self.core.check_open()?;
                fail_point!("rwlock::write_waits_for_readers");
                if !guard.is_held() {
                    drop(guard);
                    if matches!(wait, Wait::No) || wait.over(Instant::now()) {
                        return Ok(None);
                    }
                    continue 'claim;
                }
                let seen = self.nudges();
                let deadline = self.statement_deadline(wait);
                fail_point!("rwlock::write_before_listing");
                let rows =
                    self.core
                        .store
                        .list(&self.reader_prefix, i64::from(MAX_READERS), deadline)?;
                let slots: Vec<&ListedRow> = rows
                    .iter()
                    .filter(|row| row.lock_key.starts_with(&*self.reader_prefix))
                    .collect();
                if !slots.iter().any(|row| row.state == STATE_HELD) {
                    if let Some(token) = self.write_token(&guard, &slots, wait, ttl)? {
                        // The write side is the user's from here: its loss is reported.
                        if guard.lease().report_losses(self.core.on_lost.as_ref()) {
                            return Ok(Some((guard, token)));
                        }
                        // The claim ran out meanwhile: claim again.
                        continue;
                    }
                    // No token yet: readers took the slots meanwhile (they let go, as they see
                    // the claim), rows did not answer, or the database clock reads below the
                    // largest token while its rows do not answer (see "Fencing").
                }
                if !matches!(wait, Wait::No) {
                    self.watch_readers(&slots, poller, watched);
                }
                if !self.sleep_between_polls(wait, seen) {
                    return Ok(None);
                }
            }
        }
    }

    /// Takes the write row: one attempt, and, when another writer has it, a claim row that
    /// keeps new readers out until this writer has the write row or gives up (see "Writer
    /// preference"), and then the wait for the write row.
    fn take_write_row(
        &self,
        wait: Wait,
        ttl: Duration,
        answered: &mut bool,
    ) -> Result<Option<LockGuard>> {
        if matches!(wait, Wait::No) {
            let taken = self.writer.try_lock_with_ttl(ttl)?;
            *answered = true;
            return Ok(taken);
        }
        let first = match self
            .writer
            .try_lock_once_until(self.statement_deadline(wait), ttl)
        {
            Err(Error::Timeout { .. }) if !wait.over(Instant::now()) => None,
            Err(e) => return Err(e),
            Ok(first) => {
                *answered = true;
                first
            }
        };
        if first.is_some() {
            return Ok(first);
        }
        let claim = self.take_claim(wait, ttl)?;
        fail_point!("rwlock::write_claimed");
        let taken = match wait {
            Wait::Until(deadline) => self.writer.try_lock_until_with_ttl(deadline, ttl)?,
            _ => Some(self.writer.lock_with_ttl(ttl)?),
        };
        // The write row is the claim from here on (or the wait is over).
        drop(claim);
        Ok(taken)
    }

    /// A free claim row, if one is: one try of each, from a random one on.
    fn take_claim(&self, wait: Wait, ttl: Duration) -> Result<Option<LockGuard>> {
        let mut patience = Patience::new(&self.core.settings);
        let count = self.claims.len();
        let start = (uuid::Uuid::new_v4().as_u128() % count as u128) as usize;
        for offset in 0..count {
            if wait.over(Instant::now()) {
                return Ok(None);
            }
            let claim = &self.claims[(start + offset) % count];
            let taken = match patience.try_row(claim, &self.core.settings, wait.deadline(), ttl) {
                Err(Error::Timeout { .. }) => return Ok(None),
                other => other?,
            };
            if taken.is_some() {
                return Ok(taken);
            }
        }
        Ok(None)
    }

    /// The write token, once no read slot is held (see "Fencing" in the module docs): a grant
    /// of a read slot, let go at once, whose token is above the largest token among `slots`
    /// (the rows of the listing that found no slot held); the larger of it and the write row's
    /// own token. `None` (poll again) when no slot gave such a grant: every slot was taken
    /// meanwhile or did not answer, or the database clock reads below that largest token and
    /// the rows that carry it did not answer.
    fn write_token(
        &self,
        claim: &LockGuard,
        slots: &[&ListedRow],
        wait: Wait,
        ttl: Duration,
    ) -> Result<Option<u64>> {
        let largest = slots.iter().map(|row| row.token).max();
        let order = self.token_slots(slots);
        let mut patience = self.token_patience.lock();
        let mut outcome = Ok(None);
        for (index, slot) in order.into_iter().enumerate() {
            if index > 0 && wait.deadline().is_some_and(|d| d <= Instant::now()) {
                break;
            }
            let lock = &self.readers[slot];
            if lock.is_held_by_current_thread() {
                // This thread's read lease on it ran out (or it asks for an upgrade).
                continue;
            }
            // A row held, or one that does not answer in its share of the wait (another
            // session holds it locked): the next slot.
            let grant = match patience.try_row(lock, &self.core.settings, wait.deadline(), ttl) {
                Err(Error::Timeout { .. }) if !wait.over(Instant::now()) => break,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
                Ok(grant) => grant,
            };
            let Some(grant) = grant else {
                continue;
            };
            let token = grant.fencing_token();
            if let Err(e) = grant.unlock() {
                // The row runs out after its time-to-live; the token is taken all the same.
                log::warn!(
                    "could not release read slot {slot} of {:?} after taking the write token: {e}",
                    self.name
                );
            }
            // A grant not above the largest token means the database clock reads below it;
            // the rows that carry it were tried first, and another slot's grant would fall
            // short as well: poll again.
            if largest.is_none_or(|largest| i128::from(token) > i128::from(largest)) {
                outcome = Ok(Some(token.max(claim.fencing_token())));
            }
            break;
        }
        patience.round_over(&self.core.settings);
        outcome
    }

    /// The read slots in the order the write token tries them: the slots with a row in `slots`
    /// by token, largest first (a grant of a row that carries the largest token is above it
    /// by construction), then the slots without a row.
    fn token_slots(&self, slots: &[&ListedRow]) -> Vec<usize> {
        let mut rows: Vec<(i64, usize)> = slots
            .iter()
            .filter_map(|row| {
                let slot = self.reader_keys.iter().position(|k| **k == *row.lock_key)?;
                Some((row.token, slot))
            })
            .collect();
        rows.sort_unstable_by(|a, b| b.cmp(a));
        let mut order: Vec<usize> = rows.iter().map(|(_, slot)| *slot).collect();
        let rowless = (0..self.readers.len()).filter(|slot| !order.contains(slot));
        order.extend(rowless.collect::<Vec<_>>());
        order
    }

    /// Registers the held read slots among `slots` for release wake-ups (on MySQL only the
    /// first [`KEYED_WATCHES`](crate::lock::KEYED_WATCHES)).
    fn watch_readers(&self, slots: &[&ListedRow], poller: &Weak<dyn Nudge>, watched: &mut [bool]) {
        let watch_limit = match self.core.store.listener_watches_keys().is_some() {
            true => crate::lock::KEYED_WATCHES,
            false => watched.len(),
        };
        for row in slots.iter().filter(|row| row.state == STATE_HELD) {
            if watched.iter().filter(|w| **w).count() >= watch_limit {
                break;
            }
            let Some(slot) = self.reader_keys.iter().position(|k| **k == *row.lock_key) else {
                continue;
            };
            if !watched[slot] {
                watched[slot] = self
                    .core
                    .wakeups
                    .register(&self.reader_keys[slot], Weak::clone(poller));
            }
        }
    }

    /// A writer of this registry gave up or released: local readers may go on.
    fn writer_left(&self) {
        let mut state = self.state.lock();
        state.writers -= 1;
        state.nudges += 1;
        drop(state);
        self.changed.notify_all();
    }

    /// A hold of this registry ended: pollers should look again now.
    fn released(&self) {
        self.state.lock().nudges += 1;
        self.changed.notify_all();
    }
}

impl Nudge for RwInner {
    /// Called by the release listener: a row of this lock was released elsewhere.
    fn nudge(&self) {
        self.released();
    }
}

/// A handle on one reader/writer lock of a registry (see [`LockRegistry::rw_lock`](crate::LockRegistry::rw_lock)). Cheap to
/// clone.
///
/// Neither side is reentrant, whatever the guards' kind: each read is a hold of its own (a
/// read slot), and a thread that holds one side and asks for the write side, or holds the
/// write side and asks to read, waits for itself (until its deadline, or for ever).
pub struct RwLock<H: Holding = ThisThread> {
    inner: Arc<RwInner>,
    _holder: PhantomData<fn() -> H>,
}

impl<H: Holding> Clone for RwLock<H> {
    fn clone(&self) -> Self {
        RwLock {
            inner: Arc::clone(&self.inner),
            _holder: PhantomData,
        }
    }
}

impl<H: Holding> RwLock<H> {
    /// The same lock, whose read and write guards belong to no thread: `Send` and `Sync` (see
    /// [`AnyThread`]).
    pub fn any_thread(&self) -> RwLock<AnyThread> {
        RwLock {
            inner: Arc::clone(&self.inner),
            _holder: PhantomData,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    acquire_methods!(
        "the read side",
        ReadGuard,
        read,
        read,
        read_with_ttl,
        try_read,
        try_read_with_ttl,
        try_read_for,
        try_read_for_with_ttl,
        try_read_until,
        try_read_until_with_ttl
    );

    acquire_methods!(
        "the write side",
        WriteGuard,
        write,
        write,
        write_with_ttl,
        try_write,
        try_write_with_ttl,
        try_write_for,
        try_write_for_with_ttl,
        try_write_until,
        try_write_until_with_ttl
    );
}

impl<H: Holding> std::fmt::Debug for RwLock<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.inner.name)
            .finish()
    }
}

/// A read hold of a reader/writer lock by the current thread, a lease of its own; released
/// when dropped ([`unlock`](Self::unlock) returns the errors). It stays on its thread, like a
/// lock guard, unless taken through [`RwLock::any_thread`].
#[must_use = "if unused the read hold is released at once"]
pub struct ReadGuard<H: Holding = ThisThread> {
    lock: Arc<RwInner>,
    slot: u32,
    guard: Option<LockGuard<H>>,
}

impl ReadGuard {
    /// This read hold, taken for this thread, as one of kind `H`.
    fn holding<H: Holding>(mut self) -> ReadGuard<H> {
        ReadGuard {
            lock: Arc::clone(&self.lock),
            slot: self.slot,
            guard: self.guard.take().map(LockGuard::holding),
        }
    }
}

impl<H: Holding> ReadGuard<H> {
    lease_guard_methods!(lock);

    /// The read slot this hold took, 0 to [`MAX_READERS`] - 1.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The fencing token of this hold's grant: larger than every earlier grant of its
    /// [`slot`](Self::slot); every later write guard's token is larger still.
    pub fn fencing_token(&self) -> u64 {
        self.lease_guard().fencing_token()
    }

    /// Releases the read hold; `Err(LeaseLost)` means a writer may have held the lock
    /// meanwhile.
    pub fn unlock(mut self) -> Result<()> {
        let released = self.guard.take().map_or(Ok(()), LockGuard::unlock);
        self.lock.released();
        released
    }
}

impl<H: Holding> Drop for ReadGuard<H> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            self.lock.released();
        }
    }
}

/// The write side of a reader/writer lock, held by the current thread; released when dropped
/// ([`unlock`](Self::unlock) returns the errors). It stays on its thread, like a lock guard,
/// unless taken through [`RwLock::any_thread`].
#[must_use = "if unused the write side is released at once"]
pub struct WriteGuard<H: Holding = ThisThread> {
    lock: Arc<RwInner>,
    guard: Option<LockGuard<H>>,
    /// The write token (see "Fencing" in the module docs).
    token: u64,
}

impl WriteGuard {
    /// This write hold, taken for this thread, as one of kind `H`.
    fn holding<H: Holding>(mut self) -> WriteGuard<H> {
        WriteGuard {
            lock: Arc::clone(&self.lock),
            guard: self.guard.take().map(LockGuard::holding),
            token: self.token,
        }
    }
}

impl<H: Holding> WriteGuard<H> {
    lease_guard_methods!(lock);

    /// The fencing token of this write hold: larger than every earlier grant of the lock, read
    /// or write, also after rows of the lock were deleted (see "Fencing" in the module docs).
    /// Every write hold takes a token of its own, so it may differ from the token the table
    /// shows for the write row.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Releases the write side; `Err(LeaseLost)` means others may have held the lock
    /// meanwhile.
    pub fn unlock(mut self) -> Result<()> {
        let released = self.guard.take().map_or(Ok(()), LockGuard::unlock);
        self.lock.writer_left();
        released
    }
}

impl<H: Holding> Drop for WriteGuard<H> {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            self.lock.writer_left();
        }
    }
}

impl<H: Holding> std::fmt::Debug for ReadGuard<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadGuard")
            .field("name", &self.lock.name)
            .field("slot", &self.slot)
            .field("guard", &self.guard)
            .finish()
    }
}

impl<H: Holding> std::fmt::Debug for WriteGuard<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGuard")
            .field("name", &self.lock.name)
            .field("fencing_token", &self.token)
            .field("guard", &self.guard)
            .finish()
    }
}
