//! The typed API of one lock: the [`Lock`] handle and the [`LockGuard`] a holder keeps.

use super::{Holder, LockInner, Wait};
use crate::error::{Error, LossReason, Result};
use crate::lease::{Lease, LeaseLost, Renewal};
use crate::wakeups::Nudge;
use crossbeam_channel::Receiver;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// A handle on one named lock of a registry. Cheap to clone; all clones (and every later
/// [`LockRegistry::obtain`](crate::LockRegistry::obtain) of the same key while this one is in
/// use) share one local queue.
///
/// Acquiring is reentrant per thread: a thread that holds the lock and asks again gets another
/// guard at once (and the lock is released when the outermost guard goes). A nested acquire
/// keeps the lease's current time-to-live. A `Lock` is `Send` and `Sync`, while its guards
/// stay on the thread that took it (see [`LockGuard`]): to hold the lock on another thread,
/// move a clone of the `Lock` there and lock it there, or take guards that may move through
/// [`any_thread`](Self::any_thread).
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
pub struct Lock<H: Holding = ThisThread> {
    pub(super) inner: Arc<LockInner>,
    _holder: PhantomData<fn() -> H>,
}

impl<H: Holding> Clone for Lock<H> {
    fn clone(&self) -> Self {
        Lock {
            inner: Arc::clone(&self.inner),
            _holder: PhantomData,
        }
    }
}

/// Who a guard belongs to: [`ThisThread`] (the default) or [`AnyThread`]. The type parameter
/// of [`Lock`], [`LockGuard`], [`LockSet`](crate::LockSet) and
/// [`LockSetGuard`](crate::LockSetGuard); implemented by those two types only.
pub trait Holding: sealed::Holding {}

impl<H: sealed::Holding> Holding for H {}

mod sealed {
    pub trait Holding: 'static {
        /// The holder an acquire of this kind acquires for.
        fn holder() -> super::Holder;
    }

    impl Holding for super::ThisThread {
        fn holder() -> super::Holder {
            super::Holder::this_thread()
        }
    }

    impl Holding for super::AnyThread {
        fn holder() -> super::Holder {
            super::Holder::new_guard()
        }
    }
}

/// Guards that belong to the thread that took them (the default): reentrant — a thread that
/// holds a key and asks again gets a nested guard at once, and the key goes with the thread's
/// outermost guard — and neither `Send` nor `Sync`. See [`LockGuard`].
pub struct ThisThread(PhantomData<*const ()>);

/// Guards that belong to themselves, not to a thread: `Send` and `Sync`, so any thread may
/// hold, use, move and drop them, and not reentrant — every acquire is a holder of its own,
/// which waits like any other thread while the key is held, also by a guard of the same
/// thread. Taken through [`Lock::any_thread`] (or [`LockSet::any_thread`](crate::LockSet::any_thread)).
///
/// A thread that holds a key through a [`ThisThread`] guard and asks for an `AnyThread` one
/// gets [`Error::InvalidSetting`] at once (it would wait for itself); a thread that holds an
/// `AnyThread` guard and asks again waits until that guard is dropped, by whichever thread has
/// it — as a thread that locks a `std::sync::Mutex` twice.
pub struct AnyThread(());

impl Nudge for LockInner {
    /// Called by the release listener (the lock was released elsewhere) and by the registry
    /// closing: the poller tries, or looks at the registry, now; closing also releases a
    /// lingering lease.
    fn nudge(&self) {
        let mut state = self.state.lock();
        if self.core.is_closed() && state.lingers() && state.db_user.is_none() {
            // A closed registry keeps no key nobody holds.
            state.linger_end = None;
            self.release_lingering(&mut state, false);
        }
        state.nudged = true;
        let polling = state.db_user.is_some();
        state.wake_all();
        drop(state);
        if polling && self.waits_itself() {
            // A poller asleep on its own wakes as for a release.
            self.core.store.interrupt_release_waits(&self.lock_key);
        }
    }
}

impl Lock {
    pub(crate) fn new(inner: Arc<LockInner>) -> Self {
        Lock {
            inner,
            _holder: PhantomData,
        }
    }
}

impl<H: Holding> Lock<H> {
    /// The same lock, whose guards belong to no thread: `Send` and `Sync`, not reentrant (see
    /// [`AnyThread`]). It shares the key's local queue with every other handle of the key.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
    /// let guard = registry.obtain("import")?.any_thread().lock()?;
    /// let token = guard.fencing_token();
    /// // The guard goes to a worker, which does the work and unlocks.
    /// let worker = std::thread::spawn(move || -> leasehold::Result<u64> {
    ///     let token = guard.fencing_token(); // ... writes carrying the token ...
    ///     guard.unlock()?;
    ///     Ok(token)
    /// });
    /// assert_eq!(worker.join().expect("the worker ran")?, token);
    /// # Ok(()) }
    /// ```
    pub fn any_thread(&self) -> Lock<AnyThread> {
        Lock {
            inner: Arc::clone(&self.inner),
            _holder: PhantomData,
        }
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
        self.inner.state.lock().owner == Some(Holder::this_thread())
    }

    /// Blocks until the lock is granted, with the registry's default time-to-live.
    ///
    /// Polls the database at least once per `idle_between_tries` while another instance holds the lock, and
    /// wakes at once when another thread of this registry releases it. Returns `Err` only when
    /// the database keeps failing for `operation_timeout` or refuses for good; an attempt it
    /// answers "busy" throughout (on SQLite, another connection holds the file's write lock)
    /// counts as a refusal, and the wait goes on.
    pub fn lock(&self) -> Result<LockGuard<H>> {
        self.lock_with_ttl(self.inner.core.settings.time_to_live)
    }

    /// [`lock`](Self::lock) with a time-to-live for this lease only.
    pub fn lock_with_ttl(&self, ttl: Duration) -> Result<LockGuard<H>> {
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
    pub fn with_lock<T>(&self, work: impl FnOnce(&LockGuard<H>) -> T) -> Result<T> {
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
    pub fn try_lock(&self) -> Result<Option<LockGuard<H>>> {
        self.try_lock_with_ttl(self.inner.core.settings.time_to_live)
    }

    /// [`try_lock`](Self::try_lock) with a time-to-live for this lease only.
    pub fn try_lock_with_ttl(&self, ttl: Duration) -> Result<Option<LockGuard<H>>> {
        self.inner.acquire(Wait::No, ttl)
    }

    /// One attempt, like [`try_lock_with_ttl`](Self::try_lock_with_ttl), whose statement gives
    /// up at `deadline` ([`Error::Timeout`]) rather than after `operation_timeout`.
    pub(crate) fn try_lock_once_until(
        &self,
        deadline: Instant,
        ttl: Duration,
    ) -> Result<Option<LockGuard<H>>> {
        self.inner.acquire(Wait::Once(deadline), ttl)
    }

    /// Waits at most `timeout`; `Ok(None)` if the lock was not granted in that time.
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<LockGuard<H>>> {
        self.try_lock_for_with_ttl(timeout, self.inner.core.settings.time_to_live)
    }

    /// [`try_lock_for`](Self::try_lock_for) with a time-to-live for this lease only.
    pub fn try_lock_for_with_ttl(
        &self,
        timeout: Duration,
        ttl: Duration,
    ) -> Result<Option<LockGuard<H>>> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.try_lock_until_with_ttl(deadline, ttl),
            None => self.lock_with_ttl(ttl).map(Some),
        }
    }

    /// Waits until `deadline`; `Ok(None)` if the lock was not granted by then. A deadline in the
    /// past makes one attempt, like [`try_lock`](Self::try_lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<LockGuard<H>>> {
        self.try_lock_until_with_ttl(deadline, self.inner.core.settings.time_to_live)
    }

    /// [`try_lock_until`](Self::try_lock_until) with a time-to-live for this lease only.
    pub fn try_lock_until_with_ttl(
        &self,
        deadline: Instant,
        ttl: Duration,
    ) -> Result<Option<LockGuard<H>>> {
        if deadline <= Instant::now() {
            return self.inner.acquire(Wait::No, ttl);
        }
        self.inner.acquire(Wait::Until(deadline), ttl)
    }
}

impl<H: Holding> std::fmt::Debug for Lock<H> {
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
/// to learn whether the lease was still held when it was released.
///
/// # A guard stays on the thread that took the lock
///
/// A `LockGuard` is neither `Send` nor `Sync`. Moving one into `std::thread::spawn` fails to
/// compile with "`*const ()` cannot be sent between threads safely" (the `*const ()` is the
/// marker that keeps it on its thread). The reason is reentrancy: as with Java's
/// `ReentrantLock` and Spring Integration's locks, a thread that holds a lock and asks again
/// gets a nested guard at once, and the lock goes only with the thread's outermost guard. So a
/// lock is held by a thread, and its guards cannot leave it. Three ways to work with that:
///
/// - **Take a guard for any thread**: [`Lock::any_thread`] gives a `LockGuard<AnyThread>`,
///   which is `Send` and `Sync` and does not nest (see [`AnyThread`]); any thread may use,
///   unlock or drop it, with the same handoff, renewal and loss reports.
/// - **Take the lock on the thread that does the work.** A [`Lock`] is `Clone` and `Send`:
///   move a clone into the thread and lock it there.
/// - **Hold the lock on one thread and pass the work** to others — scoped threads
///   (`std::thread::scope`), a channel, a pool — with the [fencing token](Self::fencing_token),
///   a plain `u64`, for writes that check it. The holding thread unlocks once the work is done.
///
/// ```compile_fail,E0277
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
/// let guard = registry.obtain("import")?.lock()?;
/// std::thread::spawn(move || guard.unlock()); // `*const ()` cannot be sent between threads safely
/// # Ok(()) }
/// ```
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let registry = leasehold::LockRegistry::sqlite(dir.path().join("l.db")).create_table(true).build()?;
/// let lock = registry.obtain("import")?;
///
/// // Locked on the thread that does the work:
/// let worker = std::thread::spawn({
///     let lock = lock.clone();
///     move || -> leasehold::Result<u64> {
///         let guard = lock.lock()?;
///         let token = guard.fencing_token(); // ... the work, its writes carrying the token ...
///         guard.unlock()?;
///         Ok(token)
///     }
/// });
/// worker.join().expect("the worker ran")?;
///
/// // Held here while scoped threads do the work:
/// let guard = lock.lock()?;
/// let token = guard.fencing_token();
/// let written: u64 = std::thread::scope(|scope| {
///     let parts: Vec<_> = (0..4u64)
///         .map(|part| scope.spawn(move || part + token)) // ... writes carrying `token` ...
///         .collect();
///     parts.into_iter().map(|part| part.join().expect("the part ran")).sum()
/// });
/// guard.unlock()?;
/// # assert_eq!(written, 6 + 4 * token);
/// # Ok(()) }
/// ```
///
/// # Watching for a loss
///
/// Long work can stop as soon as the lease is lost:
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
pub struct LockGuard<H: Holding = ThisThread> {
    pub(super) lock: Arc<LockInner>,
    pub(super) lease: Arc<Lease>,
    pub(super) released: bool,
    /// When this (outermost) guard was granted; `None` for a nested one.
    pub(super) held_since: Option<Instant>,
    /// `ThisThread` keeps the guard on its thread (see above).
    pub(super) _holder: PhantomData<H>,
}

impl<H: Holding> LockGuard<H> {
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
    /// The token is the grant's time on the database's clock in microseconds since the Unix
    /// epoch (16 decimal digits), or the key's previous token + 1 when that is larger (and
    /// above the highest token of the key's deleted rows, which the deletion floor keeps). It
    /// always fits a signed 64-bit integer: store it as `BIGINT` (SQLite: `INTEGER`), never as a
    /// 32-bit `INT`/`int4`. A JavaScript number holds integers exactly only up to 2⁵³ (about
    /// 9 × 10¹⁵), so pass the token to JavaScript as a string (or a `BigInt`).
    ///
    /// **A local handoff keeps the token**: threads of one registry that pass the lock among
    /// themselves share their grant's token, so the rule above refuses late writes of other
    /// instances' earlier holders but not of an earlier thread of this registry (its hold ended
    /// before the next began, yet a write it started may arrive late). If the resource must
    /// tell those apart too, build the registry with
    /// [`Tuning::local_handoff`](crate::Tuning::local_handoff) `false`: every holder then gets
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
    /// [`MAX_TIME_TO_LIVE`](crate::core::MAX_TIME_TO_LIVE); a longer one is refused with
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
        if keep > crate::core::MAX_TIME_TO_LIVE {
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
                    crate::core::MAX_TIME_TO_LIVE
                ),
            ));
        }
        self.released = true;
        self.measure_release();
        self.lock.release_keeping(&self.lease, Some(keep), false)
    }
}

impl LockGuard {
    /// This guard, taken for this thread, as a guard of kind `H`: for [`AnyThread`], the key's
    /// holder becomes the new guard (a semaphore's permit and a reader/writer lock's guards
    /// are taken for the thread, then given to their kind).
    pub(crate) fn holding<H: Holding>(mut self) -> LockGuard<H> {
        self.lock.reown(Holder::this_thread(), H::holder());
        self.released = true;
        LockGuard {
            lock: Arc::clone(&self.lock),
            lease: Arc::clone(&self.lease),
            released: false,
            held_since: self.held_since.take(),
            _holder: PhantomData,
        }
    }
}

impl<H: Holding> Drop for LockGuard<H> {
    fn drop(&mut self) {
        if !self.released {
            self.measure_release();
            if let Err(e) = self.lock.release(&self.lease) {
                log::warn!("releasing lock {:?} on drop: {e}", self.lock.key);
            }
        }
    }
}

impl<H: Holding> std::fmt::Debug for LockGuard<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.lock.key)
            .field("fencing_token", &self.lease.token)
            .field("held", &self.lease.is_held())
            .finish()
    }
}
