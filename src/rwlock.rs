//! Reader/writer locks: many readers or one writer across every instance, each hold a lease of
//! its own, and a waiting writer stops new readers from entering.
//!
//! # Storage: lock rows, as for semaphores
//!
//! A reader/writer lock `name` is [`MAX_READERS`] *read slots* and one *write row*, each an
//! ordinary lease row of the lock table (taken, renewed, released, fenced and expired by the
//! lock statements). Their `LOCK_KEY`s are the 32 hexadecimal digits of the name's UUID, then
//! `@r00` … `@r63` for the read slots and `@w00` for the write row: 36 characters, never a UUID,
//! so neither Spring Integration nor a plain lock or a semaphore (`#`) of leasehold can name
//! one. The read slots sort together, so one listing statement reads them all.
//!
//! # The protocol
//!
//! - **A reader** checks that the write row is free (one read), takes a free read slot (one
//!   acquire, as a semaphore's permit), and checks the write row again. If a writer holds or
//!   waits for the lock at either check, the reader lets its slot go and waits until the write
//!   row is free, polling it every `idle_between_tries` (woken at once by its release, as a
//!   lock's waiter is).
//! - **A writer** takes the write row (as a lock, waiting like one), which from then on keeps
//!   new readers out, and then waits until no read slot is held on the database clock (one
//!   listing per poll, woken by a read slot's release). Then it holds the lock.
//!
//! Each side writes its own row and then reads the other's, each statement in a transaction of
//! its own: if the reader's second check does not see the writer's row, the writer's grant
//! committed after that check began, so the writer's listing, which follows its grant, sees the
//! reader's slot. So a reader and a writer never both hold the lock; at worst both back off
//! (the reader lets go, the writer waits for it) and the writer gets in. A waiting writer holds
//! its row, renewed in the background like any lease, so readers of every instance stop
//! entering: a stream of readers cannot starve it. It waits at most for the readers already in
//! to leave, plus one poll.
//!
//! **Fencing.** A write guard's token is the write row's token plus the largest token of the
//! read slots, read by the writer's last listing (after its grant, so it covers every read
//! hold that ended or runs out before the write hold; rows only keep or raise their tokens).
//! It therefore exceeds every earlier read grant (the write row's token is positive), and
//! every earlier write's (its row token is larger, the read part no smaller), on any database
//! and whatever its clock did — without another statement. Read tokens order the grants of
//! one slot only; a local handoff between writers of one registry may keep the token, as a
//! lock's handoff does. The table shows the rows' own tokens.
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
use crate::backend::STATE_HELD;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::lock::{Lock, LockGuard, LockInner};
use crate::wakeups::Nudge;
use crate::LockRegistry;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// How many readers a reader/writer lock admits at once (its read slots).
pub const MAX_READERS: u32 = 64;

/// The hexadecimal digits of `name`'s UUID, the stem of its read and write rows.
fn stem(name: &str) -> String {
    crate::key::lock_key_for(name)
        .chars()
        .filter(|c| *c != '-')
        .collect()
}

/// The live reader/writer locks of one registry, by name.
pub(crate) type RwLockCache = HashMap<String, Weak<RwInner>>;

impl LockRegistry {
    /// The reader/writer lock `name`: any number of readers (up to [`MAX_READERS`]) or one
    /// writer at a time, across every instance using the table and region. Shared with every
    /// other user of that name in this registry; a lock, a semaphore and a reader/writer lock
    /// of one name are unrelated.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let path = dir.path().join("l.db");
    /// use std::time::Duration;
    /// let host_a = leasehold::LockRegistry::sqlite(&path).create_table(true).build()?;
    /// let host_b = leasehold::LockRegistry::sqlite(&path).build()?;
    /// let cache = host_a.rw_lock("cache")?;
    /// let reading = cache.read()?;
    /// let also_reading = host_b.rw_lock("cache")?.try_read_for(Duration::from_secs(1))?;
    /// assert!(also_reading.is_some(), "readers share");
    /// assert!(host_b.rw_lock("cache")?.try_write()?.is_none(), "a writer waits for them");
    /// drop((reading, also_reading));
    /// let writing = host_b.rw_lock("cache")?.write()?;
    /// assert!(cache.try_read()?.is_none(), "and keeps readers out");
    /// writing.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn rw_lock(&self, name: &str) -> Result<RwLock> {
        crate::key::validate_key(name)?;
        let mut live = self.rw_locks.lock();
        if let Some(inner) = live.get(name).and_then(Weak::upgrade) {
            return Ok(RwLock { inner });
        }
        let inner = Arc::new(RwInner::new(name, &self.core));
        live.retain(|_, known| known.strong_count() > 0);
        live.insert(name.to_string(), Arc::downgrade(&inner));
        Ok(RwLock { inner })
    }
}

/// What the table says about a reader/writer lock, for operators: see
/// [`LockRegistry::rw_lock_status`].
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

impl LockRegistry {
    /// The readers and the writer of reader/writer lock `name`, as the database records them
    /// now; for operators (`leasehold status` shows it). One listing statement (the lock's
    /// rows sort together); it writes nothing.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// let cache = registry.rw_lock("cache")?;
    /// let reading = cache.read()?;
    /// let status = registry.rw_lock_status("cache")?;
    /// assert_eq!(status.held_readers().len(), 1);
    /// assert!(status.held_writer().is_none());
    /// drop(reading);
    /// let writing = cache.write()?;
    /// let status = registry.rw_lock_status("cache")?;
    /// assert!(status.held_readers().is_empty());
    /// assert_eq!(status.held_writer().unwrap().client_id.as_deref(), Some(registry.client_id()));
    /// # drop(writing);
    /// # Ok(()) }
    /// ```
    pub fn rw_lock_status(&self, name: &str) -> Result<RwLockStatus> {
        crate::key::validate_key(name)?;
        let prefix = format!("{}@", stem(name));
        let (read_prefix, write_key) = (format!("{prefix}r"), format!("{prefix}w00"));
        let mut status = RwLockStatus {
            readers: Vec::new(),
            writer: None,
        };
        // "…@" sorts before the read slots (`@r…`), and they before the write row (`@w00`).
        let rows = self
            .listing()
            .page(Some(&prefix), MAX_READERS as usize + 1)?;
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
    state: Mutex<LocalState>,
    changed: Condvar,
}

impl RwInner {
    fn new(name: &str, core: &Arc<Core>) -> Self {
        let stem = stem(name);
        let row = |lock_key: &str| {
            Lock::new(Arc::new(LockInner::with_lock_key(
                name,
                lock_key.to_string(),
                Arc::clone(core),
            )))
        };
        let writer_key: Arc<str> = format!("{stem}@w00").into();
        let reader_keys: Vec<Arc<str>> = (0..MAX_READERS)
            .map(|slot| format!("{stem}@r{slot:02}").into())
            .collect();
        RwInner {
            name: name.into(),
            core: Arc::clone(core),
            writer: row(&writer_key),
            readers: reader_keys.iter().map(|key| row(key)).collect(),
            writer_key,
            reader_keys,
            reader_prefix: format!("{stem}@r"),
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
    /// [`Self::nudges`]); `false` when the wait is over. Sets `waited`: the lock was found
    /// taken.
    fn sleep_between_polls(&self, wait: Wait, seen: u64, waited: &mut bool) -> bool {
        *waited = true;
        let now = Instant::now();
        if wait.over(now) {
            return false;
        }
        let next_poll = now + self.core.settings.idle_between_tries;
        let wake_at = wait.deadline().map_or(next_poll, |d| d.min(next_poll));
        self.core.wakeups.before_sleep();
        let mut state = self.state.lock();
        while Instant::now() < wake_at && state.nudges == seen {
            self.changed.wait_until(&mut state, wake_at);
        }
        !wait.over(Instant::now())
    }

    /// `outcome` of a wait; a timeout of a bounded wait that had found the lock taken (`waited`)
    /// means "not granted in time" (often a statement waiting for a pooled connection).
    fn timed_out_as_none<T>(
        wait: Wait,
        waited: bool,
        outcome: Result<Option<T>>,
    ) -> Result<Option<T>> {
        match outcome {
            Err(Error::Timeout { .. }) if waited && wait.deadline().is_some() => Ok(None),
            other => other,
        }
    }

    /// Whether the write row is held on the database clock (by anyone, this registry too).
    fn write_row_held(&self, wait: Wait) -> Result<bool> {
        let deadline = self.statement_deadline(wait);
        Ok(self
            .core
            .store
            .holder(&self.writer_key, deadline)?
            .is_some())
    }

    fn read(self: &Arc<Self>, wait: Wait, ttl: Duration) -> Result<Option<ReadGuard>> {
        self.core.settings.check_ttl("time_to_live", ttl)?;
        let poller = self.as_poller();
        let wakeups = &self.core.wakeups;
        // Readers wait for the write row; a reader that finds every read slot taken polls.
        let registered =
            !matches!(wait, Wait::No) && wakeups.register(&self.writer_key, Weak::clone(&poller));
        let mut waited = false;
        let outcome = self.read_loop(wait, ttl, &mut waited);
        let outcome = Self::timed_out_as_none(wait, waited, outcome);
        if registered {
            wakeups.unregister(&self.writer_key, &poller);
        }
        outcome
    }

    fn read_loop(
        self: &Arc<Self>,
        wait: Wait,
        ttl: Duration,
        waited: &mut bool,
    ) -> Result<Option<ReadGuard>> {
        let start = (uuid::Uuid::new_v4().as_u128() % u128::from(MAX_READERS)) as usize;
        loop {
            {
                let mut state = self.state.lock();
                while state.writers > 0 {
                    // A writer of this registry has the lock or waits for it.
                    *waited = true;
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
            if self.write_row_held(wait)? {
                if !self.sleep_between_polls(wait, seen, waited) {
                    return Ok(None);
                }
                continue;
            }
            let Some((slot, guard)) = self.take_read_slot(start, wait, ttl)? else {
                if !self.sleep_between_polls(wait, seen, waited) {
                    return Ok(None);
                }
                continue;
            };
            if self.write_row_held(wait)? {
                // A writer came in between: let it have the lock.
                drop(guard);
                if !self.sleep_between_polls(wait, seen, waited) {
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

    /// One try of every read slot, from `start` on, skipping this thread's own.
    fn take_read_slot(
        &self,
        start: usize,
        wait: Wait,
        ttl: Duration,
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
            let granted = match wait {
                Wait::Until(deadline) => lock.try_lock_once_until(deadline, ttl)?,
                _ => lock.try_lock_with_ttl(ttl)?,
            };
            if let Some(guard) = granted {
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
        let mut waited = false;
        let outcome = self.write_loop(wait, ttl, &poller, &mut watched, &mut waited);
        let outcome = Self::timed_out_as_none(wait, waited, outcome);
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

    /// Takes the write row, then waits for the readers to leave; the row's guard once the
    /// write side is held.
    fn write_loop(
        &self,
        wait: Wait,
        ttl: Duration,
        poller: &Weak<dyn Nudge>,
        watched: &mut [bool],
        waited: &mut bool,
    ) -> Result<Option<(LockGuard, u64)>> {
        let take = |wait: Wait| match wait {
            Wait::No => self.writer.try_lock_with_ttl(ttl),
            Wait::Until(deadline) => self.writer.try_lock_until_with_ttl(deadline, ttl),
            Wait::Forever => self.writer.lock_with_ttl(ttl).map(Some),
        };
        let Some(guard) = take(wait)? else {
            return Ok(None);
        };
        loop {
            let seen = self.nudges();
            let deadline = self.statement_deadline(wait);
            let rows =
                self.core
                    .store
                    .list(&self.reader_prefix, i64::from(MAX_READERS), deadline)?;
            let slots = rows
                .iter()
                .filter(|row| row.lock_key.starts_with(&self.reader_prefix));
            let readers = slots.clone().filter(|row| row.state == STATE_HELD).count();
            if readers == 0 && guard.is_held() {
                let highest_read = slots.map(|row| row.token).max().unwrap_or(0);
                let own = i64::try_from(guard.fencing_token()).unwrap_or(i64::MAX);
                let token = own.saturating_add(highest_read.max(0)) as u64;
                return Ok(Some((guard, token)));
            }
            if !guard.is_held() {
                return Err(Error::LeaseLost {
                    key: self.name.to_string(),
                    reason: crate::LossReason::Expired(None),
                });
            }
            let watch_limit = match self.core.store.listener_watches_keys().is_some() {
                true => crate::semaphore::KEYED_WATCHES,
                false => watched.len(),
            };
            if !matches!(wait, Wait::No) {
                for row in slots.filter(|row| row.state == STATE_HELD) {
                    if watched.iter().filter(|w| **w).count() >= watch_limit {
                        break;
                    }
                    let Some(slot) = self.reader_keys.iter().position(|k| **k == *row.lock_key)
                    else {
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
            if !self.sleep_between_polls(wait, seen, waited) {
                return Ok(None);
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

/// A handle on one reader/writer lock of a registry (see [`LockRegistry::rw_lock`]). Cheap to
/// clone.
#[derive(Clone)]
pub struct RwLock {
    inner: Arc<RwInner>,
}

impl RwLock {
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

impl std::fmt::Debug for RwLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.inner.name)
            .finish()
    }
}

/// A read hold of a reader/writer lock by the current thread, a lease of its own; released
/// when dropped ([`unlock`](Self::unlock) returns the errors). `!Send`, like a lock guard.
#[must_use = "if unused the read hold is released at once"]
pub struct ReadGuard {
    lock: Arc<RwInner>,
    slot: u32,
    guard: Option<LockGuard>,
}

impl ReadGuard {
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

impl Drop for ReadGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            self.lock.released();
        }
    }
}

/// The write side of a reader/writer lock, held by the current thread; released when dropped
/// ([`unlock`](Self::unlock) returns the errors). `!Send`, like a lock guard.
#[must_use = "if unused the write side is released at once"]
pub struct WriteGuard {
    lock: Arc<RwInner>,
    guard: Option<LockGuard>,
    /// The write row's token plus the largest read slot token (see the module docs).
    token: u64,
}

impl WriteGuard {
    lease_guard_methods!(lock);

    /// The fencing token of this write hold: larger than every earlier grant of the lock, read
    /// or write (a local handoff between writers of one registry may keep it, as a lock's
    /// does). It is the write row's token plus the largest token of the read slots, so it is
    /// not the token the table shows for the write row.
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

impl Drop for WriteGuard {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.take() {
            drop(guard);
            self.lock.writer_left();
        }
    }
}

impl std::fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadGuard")
            .field("name", &self.lock.name)
            .field("slot", &self.slot)
            .field("guard", &self.guard)
            .finish()
    }
}

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteGuard")
            .field("name", &self.lock.name)
            .field("fencing_token", &self.token)
            .field("guard", &self.guard)
            .finish()
    }
}
