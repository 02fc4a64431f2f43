//! The registry's view of a database ([`Store`]) and its one implementation over any backend
//! ([`SqlStore`]): the lease operations, each on its pool with a deadline, written once.

#[cfg(feature = "failpoints")]
use super::injected_failure;
use super::pools::{build_pool, Pool};
use super::retry::Unanswered;
use super::statistics::Counters;
#[cfg(feature = "failpoints")]
use super::Failure;
use super::{
    pairs_json, Backend, BatchRows, HolderRow, ListedRow, ListenerHandler, OwnedParams,
    PoolSettings, Statements, Statistics, TableSettings,
};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A grant from the database: the lease's fencing token and when its statement was sent.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    pub token: i64,
    pub sent_at: Instant,
}

/// Why a renewal by hand timed out on a row another session kept locked (see
/// [`crate::error`]'s timeout causes, which recognize it).
pub(crate) const ROW_LOCKED: &str = "the lock row stayed locked by another session";

/// What an acquire found.
#[derive(Debug)]
pub(crate) enum Acquired {
    /// Granted.
    Granted(Grant),
    /// Held elsewhere.
    Held,
    /// The database answered every try of the attempt "busy" (on SQLite another connection
    /// holds the file's write lock; on the servers a deadlock or a lock wait ended it) until
    /// its deadline; `error` is the timeout the call reports if it ends now.
    Busy(Error),
    /// An attempt was sent and got no answer (see [`Store::acquire`]): the row may be this
    /// registry's, and stays unresolved until [`Store::resolve`] has run for it. `error` is
    /// what the call reports if it ends now.
    Unresolved {
        session: Option<super::Session>,
        error: Error,
    },
}

/// What a batch renewal found for one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batched {
    /// Renewed.
    Renewed,
    /// The row no longer carries this client and token (as `renew`'s `None`).
    NotHolder,
    /// The row is this client's, but another session held it locked: skipped, not renewed.
    RowBusy,
}

/// Which pool an operation draws from. Renewals have their own, so that waiters and user code
/// holding every main connection cannot make a held lease expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Main,
    Renewal,
}

/// The registry's view of a database: the three lease operations with deadlines.
pub(crate) trait Store: Send + Sync {
    /// One acquire attempt (retrying transient failures until `deadline`); `name` is the
    /// lock's name, stored where the table has a `LOCK_NAME` column. An acquire statement is
    /// never sent again while an earlier sending's outcome is unknown: one that got no answer
    /// is resolved ([`Store::resolve`]) before the next, and when `deadline` leaves no time
    /// for that, the call returns [`Acquired::Unresolved`].
    fn acquire(
        &self,
        lock_key: &Arc<str>,
        name: &Arc<str>,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Acquired>;
    /// Resolves an acquire of `lock_key` whose outcome is unknown: waits until `session`,
    /// the server session that ran it (when known), has ended, so that nothing sent to it
    /// can grant the row any more, then releases the row if it names this registry's client.
    /// The caller must send no acquire of `lock_key` meanwhile: then such a row can only be
    /// that statement's grant. `Ok(true)` when a grant was found and released.
    fn resolve(
        &self,
        lock_key: &Arc<str>,
        session: Option<&super::Session>,
        deadline: Instant,
    ) -> Result<bool>;
    /// Renews; `Ok(Some(sent_at))` when renewed, `Ok(None)` when this client is not the holder.
    fn renew(
        &self,
        lock_key: &str,
        token: i64,
        ttl: Duration,
        deadline: Instant,
        path: Path,
    ) -> Result<Option<Instant>>;
    /// Renews many leases of one time-to-live together, on the renewal path: `leases` are
    /// (`LOCK_KEY`, fencing token) pairs. `Ok((sent_at, found))` with `found[i]` telling what
    /// became of lease `i`; `Err` when the outcome is unknown for all of them. A row another
    /// session holds locked is skipped, not waited for ([`Batched::RowBusy`]), where the
    /// database has row locks and the default statements run.
    fn renew_batch(
        &self,
        leases: &[(&str, i64)],
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(Instant, Vec<Batched>)>;
    /// Releases; `Ok(false)` when the lease had already been lost. A non-zero `reserve` ends
    /// a turn: the row stays out of reach of leasehold's grant for that long (parameter 4 of
    /// the release statement, in µs) and nobody is woken; zero wakes the key's waiters.
    fn release(
        &self,
        lock_key: &Arc<str>,
        token: i64,
        deadline: Instant,
        reserve: Duration,
    ) -> Result<bool>;
    /// Whether acquires follow the waiting line (see `backend::queue`): then a caller that
    /// goes on waiting after a refusal takes a place ([`Store::take_place`]).
    fn has_line(&self) -> bool;
    /// Takes or refreshes this client's place in the line of `lock_key`, for `ttl`.
    fn take_place(&self, lock_key: &str, ttl: Duration, deadline: Instant) -> Result<()>;
    /// Leaves the line of `lock_key`.
    fn leave_line(&self, lock_key: &str, deadline: Instant) -> Result<()>;
    /// Whether a grant removes the client's place in line itself (see
    /// `Backend::ACQUIRE_LEAVES_LINE`).
    fn grant_leaves_line(&self) -> bool;
    /// `SQLite`, `PostgreSQL`, `MySQL`.
    fn backend_name(&self) -> &'static str;
    /// The table, region and client id the statements bind.
    fn table_settings(&self) -> &TableSettings;
    /// The statements this store runs.
    fn statements(&self) -> &Statements;
    /// Statements sent so far.
    fn statistics(&self) -> Statistics;
    /// Whether the listener serves only the keys waited for (see
    /// [`Backend::LISTENER_WATCHES_KEYS`]), and how many at most
    /// ([`Backend::LISTENER_WATCHED_KEYS_MAX`]): `None` when it serves every key.
    fn listener_watches_keys(&self) -> Option<usize>;
    /// See [`Backend::WAITERS_WAIT_THEMSELVES`].
    fn waiters_wait_themselves(&self) -> bool;
    /// A waiting thread's own sleep until `lock_key` is released (see
    /// [`Backend::release_wait`]).
    fn release_wait(&self, lock_key: &str) -> Option<Box<dyn super::ReleaseWait>>;
    /// Ends the [`Store::release_wait`] sleeps of `lock_key` now.
    fn interrupt_release_waits(&self, lock_key: &str);
    /// Starts the backend's release listener (see [`Backend::listen_for_releases`]).
    fn listen_for_releases(
        &self,
        handler: ListenerHandler,
        requests: crossbeam_channel::Receiver<()>,
    ) -> bool;
    /// Reads the database clock: (µs since the Unix epoch, when the query was sent, when the
    /// answer arrived).
    fn database_clock(&self, deadline: Instant) -> Result<(i64, Instant, Instant)>;
    /// The row holding `lock_key` on the database clock, if any (see `admin.rs`).
    fn holder(&self, lock_key: &str, deadline: Instant) -> Result<Option<HolderRow>>;
    /// Up to `limit` rows of the region whose `LOCK_KEY` sorts after `after`, in that order.
    fn list(&self, after: &str, limit: i64, deadline: Instant) -> Result<Vec<ListedRow>>;
    /// Frees `lock_key` whatever holds it; `Ok(true)` when a holder was removed.
    fn force_release(&self, lock_key: &str, deadline: Instant) -> Result<bool>;
    /// Deletes the region's rows released or expired more than `older_than` ago.
    fn delete_released_and_expired(&self, older_than: Duration, deadline: Instant) -> Result<u64>;
    /// Releases, keeping the row held until its grant + `keep` if that is still ahead;
    /// `Ok(false)` when the lease had already been lost.
    fn release_keeping(
        &self,
        lock_key: &str,
        token: i64,
        keep: Duration,
        deadline: Instant,
    ) -> Result<bool>;
    /// The number of permits recorded for semaphore `sem_key`, recording `permits` when it
    /// has none; with `check_table`, first checks that the semaphore table exists (see
    /// `backend::semaphores`).
    fn semaphore_permits(
        &self,
        sem_key: &str,
        permits: u32,
        check_table: bool,
        deadline: Instant,
    ) -> Result<i64>;
    /// The number of permits recorded for semaphore `sem_key`, recording nothing; `None` when
    /// none is, or there is no semaphore table (see `backend::semaphores`).
    fn recorded_permits(&self, sem_key: &str, deadline: Instant) -> Result<Option<i64>>;
}

/// [`Store`] over any [`Backend`]: pools, deadlines and retries, written once.
pub(crate) struct SqlStore<B: Backend> {
    pub(super) pool: Pool<B::Manager>,
    pub(super) renewal_pool: Pool<B::Manager>,
    pub(super) queries: Arc<Statements>,
    /// The batch renewal statements; `None` with a custom renew statement, which is then run
    /// once per lease.
    pub(super) batch_renew: Option<Arc<Vec<String>>>,
    /// Set when the database refused the batch statements for good (a server without
    /// `JSON_TABLE`, say): renewals then run one statement per lease.
    pub(super) batch_refused: std::sync::atomic::AtomicBool,
    pub(super) region: Arc<str>,
    pub(super) client_id: Arc<str>,
    pub(super) counters: Arc<Counters>,
    pub(super) manager: B::Manager,
    pub(super) table: TableSettings,
    /// How long an idle connection stays open (see [`PoolSettings`]).
    pub(super) idle_timeout: Duration,
    /// Whether the table has the `LOCK_NAME` column (the statements fill and list it).
    pub(super) named: bool,
    /// The empty name of every statement but acquire.
    pub(super) no_name: Arc<str>,
    /// The waiting line's statements, when acquire follows the line (see [`super::queue`]).
    pub(super) queue: Option<Arc<super::QueueStatements>>,
}

impl<B: Backend> SqlStore<B> {
    /// Builds both pools from `manager`, checks (or creates) the table and checks custom SQL.
    pub fn open(manager: B::Manager, pool: &PoolSettings, table: &TableSettings) -> Result<Self>
    where
        B::Manager: Clone,
    {
        let renewal_pool = build_pool(manager.clone(), pool.renewal_pool_size, pool, None);
        let park = B::PARKS_CONNECTION.then_some(B::mark_broken as fn(&mut super::Conn<B>));
        let main = build_pool(manager.clone(), pool.pool_size, pool, park);
        let mut store = SqlStore {
            pool: main,
            renewal_pool,
            // Chosen once the table has been checked (whether acquire can read the floor).
            queries: Arc::default(),
            batch_renew: table
                .custom
                .renew
                .is_none()
                .then(|| Arc::new(B::renew_batch_sql(&table.table))),
            batch_refused: Default::default(),
            region: table.region.as_str().into(),
            client_id: table.client_id.as_str().into(),
            counters: Arc::default(),
            manager,
            table: table.clone(),
            idle_timeout: pool.idle_timeout,
            named: false,
            no_name: Arc::from(""),
            queue: None,
        };
        let deadline = Instant::now() + pool.connect_timeout;
        let floor = store.check_table(table, deadline)?;
        store.named = store.check_name_column(table, deadline)?;
        // The line orders only leasehold's own acquire statement.
        let queue = store.open_queue(deadline)? && table.custom.acquire.is_none();
        store.queue = queue.then(|| Arc::new(B::queue_statements(&table.table)));
        let defaults = B::default_queries(&table.table, floor, store.named, queue);
        store.queries = Arc::new(Statements {
            acquire: table.custom.acquire.clone().unwrap_or(defaults.acquire),
            renew: table.custom.renew.clone().unwrap_or(defaults.renew),
            release: table.custom.release.clone().unwrap_or(defaults.release),
        });
        store.check_custom(&table.custom, deadline)?;
        if table.create_table {
            store.create_semaphore_table(deadline);
        }
        Ok(store)
    }

    /// One batch renewal statement (see [`Store::renew_batch`]) on `path`'s pool.
    fn run_batch(
        &self,
        path: Path,
        operation: &'static str,
        batch: &Arc<Vec<String>>,
        leases: &[(&str, i64)],
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(Instant, Vec<Batched>)> {
        let pairs = pairs_json(leases.iter().map(|(key, token)| (*key, *token)));
        let params = self.params(pairs.as_str(), ttl, 0);
        let (batch, counters) = (Arc::clone(batch), Arc::clone(&self.counters));
        let count = leases.len();
        let (sent_at, renewed) = self.run(path, operation, deadline, move |conn| {
            let sent_at = Instant::now();
            fail_point!("backend::renew_sent", |_| Err(injected_failure()));
            counters.renewals.fetch_add(1, Ordering::Relaxed);
            Ok((
                sent_at,
                B::renew_batch(conn, &batch, &params.borrowed(), count)?,
            ))
        })?;
        let BatchRows { renewed, busy } = renewed;
        let renewed: std::collections::HashSet<(String, i64)> = renewed.into_iter().collect();
        let busy: std::collections::HashSet<(String, i64)> = busy.into_iter().collect();
        let found = leases
            .iter()
            .map(|(key, token)| {
                let pair = ((*key).to_string(), *token);
                if renewed.contains(&pair) {
                    Batched::Renewed
                } else if busy.contains(&pair) {
                    Batched::RowBusy
                } else {
                    Batched::NotHolder
                }
            })
            .collect();
        Ok((sent_at, found))
    }

    pub(super) fn params(
        &self,
        lock_key: impl Into<Arc<str>>,
        ttl: Duration,
        token: i64,
    ) -> OwnedParams {
        OwnedParams {
            lock_key: lock_key.into(),
            region: Arc::clone(&self.region),
            client_id: Arc::clone(&self.client_id),
            ttl_micros: i64::try_from(ttl.as_micros()).unwrap_or(i64::MAX),
            token,
            name: Arc::clone(&self.no_name),
        }
    }
}

impl<B: Backend> Store for SqlStore<B> {
    fn acquire(
        &self,
        lock_key: &Arc<str>,
        name: &Arc<str>,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Acquired> {
        let mut params = self.params(Arc::clone(lock_key), ttl, 0);
        // A name the column cannot hold (PostgreSQL text has no NUL) is stored as none.
        if !name.contains('\0') {
            params.name = Arc::clone(name);
        }
        let (queries, counters) = (Arc::clone(&self.queries), Arc::clone(&self.counters));
        // Whether the database's last answer was "busy".
        let busy = Arc::new(AtomicBool::new(false));
        let answered_busy = Arc::clone(&busy);
        let attempt = move |conn: &mut super::Conn<B>| {
            let sent_at = Instant::now();
            fail_point!("backend::acquire_sent");
            counters.acquires.fetch_add(1, Ordering::Relaxed);
            let granted = B::acquire(conn, &queries.acquire, &params.borrowed());
            let is_busy = matches!(&granted, Err(f) if f.kind == super::FailureKind::Transient);
            answered_busy.store(is_busy, Ordering::Relaxed);
            let granted = granted?;
            if granted.is_some() {
                counters.grants.fetch_add(1, Ordering::Relaxed);
            }
            // An answer lost on its way back (test-only), after `return(ms)` milliseconds: the
            // grant stands, unknown to the caller.
            fail_point!("backend::acquire_answered", |ms: Option<String>| {
                let ms = ms.and_then(|ms| ms.parse().ok()).unwrap_or(0);
                std::thread::sleep(Duration::from_millis(ms));
                Err(Failure::new(
                    super::FailureKind::Broken,
                    "injected by a fail point",
                    "fail point backend::acquire_answered: the answer was lost",
                ))
            });
            Ok(granted.map(|token| Grant { token, sent_at }))
        };
        let attempt = Arc::new(attempt);
        loop {
            let mut unanswered = None;
            let attempt = Arc::clone(&attempt);
            let outcome = self.run_noting(
                Path::Main,
                "acquire",
                deadline,
                move |conn| attempt(conn),
                Some(&mut unanswered),
            );
            let (session, error) = match (unanswered, outcome) {
                (Some(Unanswered { session }), Err(error)) => (session, error),
                (None, Err(error @ Error::Timeout { .. })) if busy.load(Ordering::Relaxed) => {
                    return Ok(Acquired::Busy(error))
                }
                (_, outcome) => {
                    let grant = outcome?;
                    if let Some(grant) = &grant {
                        self.secure_renewal(lock_key, grant, deadline)?;
                        B::granted(&self.manager, &self.table, lock_key, self.idle_timeout);
                    }
                    return Ok(grant.map_or(Acquired::Held, Acquired::Granted));
                }
            };
            log::debug!("an acquire of {lock_key:?} got no answer ({error}): resolving it");
            // Resolved within the deadline, the next attempt goes out; otherwise the caller
            // resolves it later, and the call reports the latest failure.
            if Instant::now() >= deadline {
                return Ok(Acquired::Unresolved { session, error });
            }
            if let Err(error) = self.resolve(lock_key, session.as_ref(), deadline) {
                return Ok(Acquired::Unresolved { session, error });
            }
        }
    }

    fn resolve(
        &self,
        lock_key: &Arc<str>,
        session: Option<&super::Session>,
        deadline: Instant,
    ) -> Result<bool> {
        if let Some(session) = session {
            let mut pause = Duration::from_millis(1);
            loop {
                let ended = {
                    let session = session.clone();
                    self.run(Path::Main, "end a session", deadline, move |conn| {
                        B::end_session(conn, &session)
                    })?
                };
                if ended {
                    break;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout {
                        operation: "end a session",
                        waited: Duration::ZERO,
                        source: Some(
                            format!("{} session {} was still running", B::NAME, session.id).into(),
                        ),
                    });
                }
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        }
        let mine = self
            .admin_holder(lock_key, deadline)?
            .filter(|row| *row.client_id == *self.client_id);
        let Some(row) = mine else {
            return Ok(false);
        };
        self.counters.resolved.fetch_add(1, Ordering::Relaxed);
        Store::release(self, lock_key, row.token, deadline, Duration::ZERO)
    }

    fn renew(
        &self,
        lock_key: &str,
        token: i64,
        ttl: Duration,
        deadline: Instant,
        path: Path,
    ) -> Result<Option<Instant>> {
        // A renewal by hand never blocks on a row another session holds locked (its own
        // fenced transaction's, say): where one can, it runs as a batch of one, which skips
        // such a row; it tries again after short pauses until the deadline, and then says
        // that the row stayed locked.
        let batch = self.batch_renew.as_ref().filter(|_| {
            path == Path::Main && B::ROW_LOCKS && !self.batch_refused.load(Ordering::Relaxed)
        });
        if let Some(batch) = batch {
            let started = Instant::now();
            let mut pause = Duration::from_millis(1);
            let mut busy = false;
            loop {
                match self.run_batch(path, "renew", batch, &[(lock_key, token)], ttl, deadline) {
                    Ok((sent_at, found)) => match found[0] {
                        Batched::Renewed => return Ok(Some(sent_at)),
                        Batched::NotHolder => return Ok(None),
                        Batched::RowBusy => busy = true,
                    },
                    // Refused, so it did not run: the plain statement from now on.
                    Err(Error::Database { .. }) => {
                        self.batch_refused.store(true, Ordering::Relaxed);
                        break;
                    }
                    // The deadline came during a try after the row was found locked: the
                    // wait was for the row.
                    Err(Error::Timeout { .. }) if busy => {
                        return Err(Error::Timeout {
                            operation: "renew",
                            waited: started.elapsed(),
                            source: Some(ROW_LOCKED.into()),
                        })
                    }
                    Err(e) => return Err(e),
                }
                // The row was locked: again after a pause, unless that leaves no time.
                let left = deadline.saturating_duration_since(Instant::now());
                if left <= pause {
                    return Err(Error::Timeout {
                        operation: "renew",
                        waited: started.elapsed(),
                        source: Some(ROW_LOCKED.into()),
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
        }
        let params = self.params(lock_key, ttl, token);
        let (queries, counters) = (Arc::clone(&self.queries), Arc::clone(&self.counters));
        let operation = match path {
            Path::Main => "renew",
            Path::Renewal => "background renewal",
        };
        self.run(path, operation, deadline, move |conn| {
            let sent_at = Instant::now();
            fail_point!("backend::renew_sent", |_| Err(injected_failure()));
            counters.renewals.fetch_add(1, Ordering::Relaxed);
            let rows = B::update(conn, &queries.renew, &params.borrowed())?;
            Ok((rows > 0).then_some(sent_at))
        })
    }

    fn renew_batch(
        &self,
        leases: &[(&str, i64)],
        ttl: Duration,
        deadline: Instant,
    ) -> Result<(Instant, Vec<Batched>)> {
        // One lease: the plain renew statement would wait for a row another session holds
        // locked; where that can happen the batch runs even for one lease, since it skips
        // such a row.
        let one_is_enough = leases.len() == 1 && !B::ROW_LOCKS;
        let batch = match &self.batch_renew {
            Some(batch) if !one_is_enough && !self.batch_refused.load(Ordering::Relaxed) => batch,
            _ => return renew_each(self, leases, ttl, deadline),
        };
        match self.run_batch(
            Path::Renewal,
            "background renewal",
            batch,
            leases,
            ttl,
            deadline,
        ) {
            Err(Error::Database { hint, .. }) => {
                // Refused, so it did not run: renew one by one from now on.
                log::warn!(
                    "{} refused the batch renewal ({hint}); renewing one lease per statement",
                    B::NAME
                );
                self.batch_refused.store(true, Ordering::Relaxed);
                renew_each(self, leases, ttl, deadline)
            }
            other => other,
        }
    }

    fn release(
        &self,
        lock_key: &Arc<str>,
        token: i64,
        deadline: Instant,
        reserve: Duration,
    ) -> Result<bool> {
        let params = self.params(Arc::clone(lock_key), reserve, token);
        let (queries, counters) = (Arc::clone(&self.queries), Arc::clone(&self.counters));
        let released = self.run(Path::Main, "release", deadline, move |conn| {
            counters.releases.fetch_add(1, Ordering::Relaxed);
            Ok(B::update(conn, &queries.release, &params.borrowed())? > 0)
        });
        let outcome = released.as_ref().ok().copied();
        B::release_done(
            &self.manager,
            &self.table,
            lock_key,
            outcome,
            reserve.is_zero(),
        );
        released
    }

    fn has_line(&self) -> bool {
        self.queue.is_some()
    }

    fn take_place(&self, lock_key: &str, ttl: Duration, deadline: Instant) -> Result<()> {
        self.take_place_of(lock_key, ttl, deadline)
    }

    fn leave_line(&self, lock_key: &str, deadline: Instant) -> Result<()> {
        fail_point!("backend::leave_line");
        self.leave_of(lock_key, deadline)
    }

    fn grant_leaves_line(&self) -> bool {
        B::ACQUIRE_LEAVES_LINE
    }

    fn backend_name(&self) -> &'static str {
        B::NAME
    }

    fn table_settings(&self) -> &TableSettings {
        &self.table
    }

    fn statements(&self) -> &Statements {
        &self.queries
    }

    fn waiters_wait_themselves(&self) -> bool {
        B::WAITERS_WAIT_THEMSELVES
    }

    fn release_wait(&self, lock_key: &str) -> Option<Box<dyn super::ReleaseWait>> {
        B::release_wait(&self.manager, &self.table, lock_key)
    }

    fn interrupt_release_waits(&self, lock_key: &str) {
        B::interrupt_release_waits(&self.manager, &self.table, lock_key)
    }

    fn listener_watches_keys(&self) -> Option<usize> {
        B::LISTENER_WATCHES_KEYS.then_some(B::LISTENER_WATCHED_KEYS_MAX)
    }

    fn listen_for_releases(
        &self,
        handler: ListenerHandler,
        requests: crossbeam_channel::Receiver<()>,
    ) -> bool {
        B::listen_for_releases(
            &self.manager,
            &self.pool,
            &self.table,
            self.idle_timeout,
            handler,
            requests,
        )
    }

    fn database_clock(&self, deadline: Instant) -> Result<(i64, Instant, Instant)> {
        let params = self.params("", Duration::ZERO, 0);
        self.run(
            Path::Main,
            "read the database clock",
            deadline,
            move |conn| {
                let sent_at = Instant::now();
                let micros =
                    B::read_number(conn, B::clock_sql(), &params.borrowed())?.unwrap_or_default();
                Ok((micros, sent_at, Instant::now()))
            },
        )
    }

    fn statistics(&self) -> Statistics {
        self.counters.read()
    }

    fn holder(&self, lock_key: &str, deadline: Instant) -> Result<Option<HolderRow>> {
        self.admin_holder(lock_key, deadline)
    }

    fn list(&self, after: &str, limit: i64, deadline: Instant) -> Result<Vec<ListedRow>> {
        self.admin_list(after, limit, deadline)
    }

    fn force_release(&self, lock_key: &str, deadline: Instant) -> Result<bool> {
        self.admin_force_release(lock_key, deadline)
    }

    fn delete_released_and_expired(&self, older_than: Duration, deadline: Instant) -> Result<u64> {
        self.admin_delete(older_than, deadline)
    }

    fn release_keeping(
        &self,
        lock_key: &str,
        token: i64,
        keep: Duration,
        deadline: Instant,
    ) -> Result<bool> {
        self.admin_release_keeping(lock_key, token, keep, deadline)
    }
    fn semaphore_permits(
        &self,
        sem_key: &str,
        permits: u32,
        check_table: bool,
        deadline: Instant,
    ) -> Result<i64> {
        self.semaphore_permits_of(sem_key, permits, check_table, deadline)
    }

    fn recorded_permits(&self, sem_key: &str, deadline: Instant) -> Result<Option<i64>> {
        self.recorded_permits_of(sem_key, deadline)
    }
}

/// A batch renewal as one renew statement per lease (custom renew statements), on the renewal
/// path; the send instant is the first statement's, the earliest and so the safe one.
fn renew_each(
    store: &dyn Store,
    leases: &[(&str, i64)],
    ttl: Duration,
    deadline: Instant,
) -> Result<(Instant, Vec<Batched>)> {
    let started = Instant::now();
    let mut renewed = Vec::with_capacity(leases.len());
    for (lock_key, token) in leases {
        let outcome = store.renew(lock_key, *token, ttl, deadline, Path::Renewal)?;
        renewed.push(match outcome {
            Some(_) => Batched::Renewed,
            None => Batched::NotHolder,
        });
    }
    Ok((started, renewed))
}
