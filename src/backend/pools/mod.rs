//! Connection pools and the first connection: how a store gets its connections.
//!
//! # Connections on demand
//!
//! A store has two pools, the main one (`pool_size`, for acquires, releases and manual renewals)
//! and the renewal pool (`renewal_pool_size`, for background renewals only). Neither opens a
//! connection ahead of need (`min_idle` 0): a pool opens one when a statement finds none idle,
//! up to its size, and closes one that has stayed idle for `idle_connection_timeout`. r2d2
//! looks for idle connections every 30 s (a fixed rate), so an idle connection closes between
//! the timeout and 30 s after it. A process holding one lock therefore keeps one renewal
//! connection (used every renewal period) and, until it times out, the main connection that
//! acquired it. On SQLite a connection is an open file (and its page cache), closed the same
//! way. No connection is replaced for its age alone.
//!
//! # Connections discarded while callers wait
//!
//! r2d2 wakes a caller waiting for a connection when one comes back healthy or a new one is
//! opened, and opens one only for a caller that finds the pool short (when it starts waiting,
//! or each time it is woken). A connection that comes back flagged broken is closed and its
//! slot freed, but no waiting caller is woken and nothing is opened in its place (with
//! `min_idle` 0): a caller that began waiting while the pool was full sleeps until its own
//! timeout, though the pool has room. That happens when the connection comes back from a
//! thread that is not itself waiting: a statement thread whose caller gave up at its deadline,
//! or a caller that returns at its deadline after a broken attempt (MySQL's socket timeout). So the pools here
//! count their waiting callers ([`Pool`]), and whoever drops a broken connection asks for a
//! replacement while any caller waits ([`Pool::discarded`]): the new connection wakes one.
//!
//! # The parked connection (SQLite)
//!
//! An r2d2 checkout and its return cost an uncontended SQLite `lock()` + `unlock()` about as
//! much as the rest of the registry's own work together (r2d2 reads the clock five times per
//! checkout and return, takes its lock twice, clones its pool handle and signals its condition
//! variable), against a statement of a few microseconds. So SQLite's main pool
//! ([`Backend::PARKS_CONNECTION`]) keeps the connection
//! given back last *parked*: still checked out of r2d2, in a slot of the pool ([`Pool`]: a
//! `parking_lot` mutex around an `Option` of it) that the next caller takes before asking r2d2.
//!
//! - **Who touches it.** Any caller thread of the registry: [`Pool::get_timeout`] and
//!   [`Pool::try_get`] take the parked connection if there is one; [`Pool::give_back`] parks a
//!   healthy connection when the slot is empty and nobody waits, and otherwise gives it to
//!   r2d2 as before. The slot's lock is held only to move the connection in or out, never
//!   during a statement. r2d2's timer threads run the idle check (below).
//! - **Pool size.** r2d2 counts the parked connection as checked out, so it still counts
//!   toward `pool_size`; at most one connection is parked, the others idle in r2d2 as before.
//! - **Waiting callers.** A caller that finds the slot empty counts itself waiting (`waiting`,
//!   raised under the slot's lock) before it enters r2d2's checkout, and a connection is parked
//!   only while that count is zero (read under the same lock): so while any caller waits in
//!   r2d2 (the pool is full, or a connection is being opened), every connection goes back to
//!   r2d2, which hands it to a waiter, and none sits parked while a caller sleeps.
//! - **Broken connections** are never parked: a connection whose attempt failed as broken, or
//!   was given up at its deadline, is flagged and dropped into r2d2, which closes it, as before.
//!   Discarding a pool's idle connections after a failure ([`super::retry`]) discards the
//!   parked one too (it comes first from [`Pool::try_get`]).
//! - **Idle timeout.** r2d2 cannot see a parked connection idle, so the pool's own job on
//!   r2d2's timer threads (the pool is given the same three threads r2d2 would start itself)
//!   looks at the slot every half `idle_timeout` (at most 15 s, at least 10 ms): a connection
//!   found parked and unused at enough looks in a row to cover `idle_timeout` is flagged broken
//!   and given back, and r2d2 closes it. So it closes between `idle_timeout` and 1.5 ×
//!   `idle_timeout` after its last use, or up to 30 s after it for timeouts of 30 s and more:
//!   within r2d2's own bound for its idle connections. Parking reads no clock (a flag marks
//!   that the slot was used since the last look). `max_lifetime` is off for every pool, so age
//!   alone never closes a connection, parked or not.
//! - **Shutdown.** The job holds the slot weakly; the registry's pools hold it strongly, so
//!   dropping them gives the parked connection back to r2d2, which closes it with the pool.
//!   The timer threads end with r2d2's pool, their last owner, at once (r2d2's own would
//!   first wait for their next scheduled run, up to 30 s).
//!
//! PostgreSQL's and MySQL's pools park nothing: a server may close a connection idle behind
//! the pool's back, and their round trips dwarf the checkout.
//!
//! # A full server
//!
//! A server that has no connection slot left (PostgreSQL's `max_connections`, or a role's
//! `CONNECTION LIMIT`: SQLSTATE 53300, "too many clients") refuses new connections, not
//! statements on open ones. So a grant secures the lease's renewals
//! ([`SqlStore::secure_renewal`]): when the renewal pool has no connection, the grant opens
//! one before it is handed out; if the server refuses it, the grant is released at once and the
//! caller gets an error naming the full server — a lease whose renewals could not run is never
//! handed out to expire later. The renewal connection then stays while renewals use it (every
//! renewal period, which must stay below `idle_connection_timeout`, as it does by default). A
//! connection that breaks is replaced by a new one, which a full server can still refuse; no
//! client can do better there. Wherever the refusal surfaces — `build()`'s first connection,
//! an acquire or a renewal that needed a new connection and timed out — the message names
//! "too many clients" and the fix ([`crate::error`]'s `TOO_MANY_CLIENTS_FIX`: a pooler,
//! `max_connections`, fewer connections), never "start the server".
//!
//! `build()` still fails fast on a wrong URL or an absent server: each backend opens one
//! direct connection first ([`first_connection`]; SQLite opens the file), and the table check
//! that follows runs on a pooled connection. A host name that does not resolve, or a server of
//! another kind at the URL's port (found by a look at what answers there, [`look_at`]), fails
//! it at once; a server that refuses connections (it may be starting) is tried again until
//! `connect_timeout`.

#[cfg(all(test, feature = "sqlite"))]
mod parking;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod probe;
use super::{Backend, Grant, SqlStore, Store};
use crate::error::{Error, Result, TOO_MANY_CLIENTS, TOO_MANY_CLIENTS_FIX};
use parking_lot::Mutex;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use probe::{first_connection, look_at, unknown_host, Finding};
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pool settings shared by every backend.
#[derive(Debug, Clone)]
pub(crate) struct PoolSettings {
    pub pool_size: u32,
    /// Connections of the renewal pool.
    pub renewal_pool_size: u32,
    /// A pooled connection idle this long is closed (and the PostgreSQL listener's, unsubscribed
    /// this long).
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    /// The registry's `operation_timeout`: the usual deadline of one statement.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub operation_timeout: Duration,
    /// PostgreSQL: whether connections prepare named statements and keep them
    /// (`RegistryBuilder::prepared_statements`); `None`: each connection decides.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub prepared_statements: Option<bool>,
    /// PostgreSQL: where the release listener connects instead of the registry's URL
    /// (`RegistryBuilder::listener_url`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub listener_url: Option<String>,
}

/// A pool of at most `size` connections from `manager`, opened on demand (see the module docs):
/// it opens none now. A connection lives until it breaks or stays idle too long, never
/// replaced for its age alone (r2d2's default `max_lifetime` would do that every 30 minutes,
/// and a renewal that must open a new connection can be refused by a full server).
///
/// `park`: keep the connection last given back parked for the next caller (see the module
/// docs, "The parked connection"); the function flags a connection broken, so that r2d2 closes
/// it when the parked one has stayed idle for `idle_timeout`.
pub(super) fn build_pool<M: r2d2::ManageConnection>(
    manager: M,
    size: u32,
    pool: &PoolSettings,
    park: Option<fn(&mut M::Connection)>,
) -> Pool<M> {
    let mut builder = r2d2::Pool::builder()
        .max_size(size)
        .min_idle(Some(0))
        .idle_timeout(Some(pool.idle_timeout))
        .max_lifetime(None)
        .test_on_check_out(false)
        .connection_timeout(pool.connect_timeout)
        .error_handler(Box::new(r2d2::NopErrorHandler));
    // r2d2's own default (three timer threads per pool), which also run the parked
    // connection's idle check; except that they end as soon as the pool is dropped, where
    // r2d2's own would wait for the next run of their idle check (up to 30 s) first.
    let workers = park.map(|_| {
        Arc::new(
            ScheduledThreadPool::builder()
                .num_threads(3)
                .thread_name_pattern("r2d2-worker-{}")
                .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
                .build(),
        )
    });
    if let Some(workers) = &workers {
        builder = builder.thread_pool(Arc::clone(workers));
    }
    let parked = park.zip(workers).map(|(discard, workers)| {
        let parked = Arc::new(Mutex::new(Parked {
            conn: None,
            used: false,
            idle_checks: 0,
        }));
        let (idle_timeout, rate) = (pool.idle_timeout, idle_check_rate(pool.idle_timeout));
        let weak = Arc::downgrade(&parked);
        // The job holds the slot weakly: it does nothing once the pool is gone, and the timer
        // threads end with r2d2's pool, their last owner.
        workers.execute_at_fixed_rate(rate, rate, move || {
            if let Some(parked) = weak.upgrade() {
                close_if_idle(&parked, rate, idle_timeout, discard);
            }
        });
        parked
    });
    Pool {
        pool: builder.build_unchecked(manager),
        waiting: Arc::default(),
        parked,
    }
}

/// How often the parked connection's idle check runs: half the idle timeout, at most 15 s
/// (at least 10 ms), so that it closes between `idle_timeout` and 1.5 × `idle_timeout`, or 30 s
/// after it for long timeouts — r2d2's own bound for its idle connections (see
/// [`close_if_idle`]).
fn idle_check_rate(idle_timeout: Duration) -> Duration {
    (idle_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(15))
}

/// The idle check of a parked connection, every `rate`: a connection that stayed parked,
/// unused, through enough checks in a row to cover `idle_timeout` is flagged (`discard`) and
/// given back to r2d2, which closes it, as it closes its own idle connections.
fn close_if_idle<M: r2d2::ManageConnection>(
    parked: &Mutex<Parked<M>>,
    rate: Duration,
    idle_timeout: Duration,
    discard: fn(&mut M::Connection),
) {
    let mut parked = parked.lock();
    if parked.conn.is_none() || parked.used {
        // In use, or parked again since the last check.
        parked.used = false;
        parked.idle_checks = 0;
        return;
    }
    parked.idle_checks = parked.idle_checks.saturating_add(1);
    if rate.saturating_mul(parked.idle_checks) < idle_timeout {
        return;
    }
    parked.idle_checks = 0;
    // Given back to r2d2 under the slot's lock: a caller that finds the slot empty meanwhile
    // enters r2d2 only once r2d2 no longer counts the connection, so it opens a new one
    // rather than wait (with `pool_size(1)`, until its deadline) for a place that nothing
    // would announce. r2d2 never takes the slot's lock, so the order cannot deadlock.
    if let Some(mut conn) = parked.conn.take() {
        discard(&mut conn);
        drop(conn);
    }
}

/// The parked connection of a pool that parks one (see the module docs).
struct Parked<M: r2d2::ManageConnection> {
    /// Checked out of r2d2 and not in use: the next caller takes it.
    conn: Option<r2d2::PooledConnection<M>>,
    /// A connection was parked since the last idle check.
    used: bool,
    /// Idle checks in a row that found the same connection parked and unused.
    idle_checks: u32,
}

/// An r2d2 pool and how many callers wait in it for a connection (see the module docs,
/// "Connections discarded while callers wait"), and its parked connection where it keeps one.
/// Clones share all three.
pub(crate) struct Pool<M: r2d2::ManageConnection> {
    pool: r2d2::Pool<M>,
    waiting: Arc<AtomicUsize>,
    parked: Option<Arc<Mutex<Parked<M>>>>,
}

impl<M: r2d2::ManageConnection> Clone for Pool<M> {
    fn clone(&self) -> Self {
        Pool {
            pool: self.pool.clone(),
            waiting: Arc::clone(&self.waiting),
            parked: self.parked.clone(),
        }
    }
}

impl<M: r2d2::ManageConnection> Pool<M> {
    /// A connection, waiting at most `timeout` for one; counted as waiting meanwhile. The parked
    /// connection, if there is one.
    pub(super) fn get_timeout(
        &self,
        timeout: Duration,
    ) -> Result<r2d2::PooledConnection<M>, r2d2::Error> {
        if let Some(parked) = &self.parked {
            let mut parked = parked.lock();
            if let Some(conn) = parked.conn.take() {
                return Ok(conn);
            }
            // Counted under the slot's lock: from here on nothing is parked until this caller
            // leaves r2d2 (see `give_back`), so it cannot wait for a connection parked meanwhile.
            self.waiting.fetch_add(1, Ordering::SeqCst);
        } else {
            // Counted before r2d2 sees the pool full, so that a connection discarded after that
            // look finds the count raised (r2d2's lock orders the two).
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
        let conn = self.pool.get_timeout(timeout);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        conn
    }

    /// An idle connection (the parked one first), if there is one; never waits.
    pub(super) fn try_get(&self) -> Option<r2d2::PooledConnection<M>> {
        if let Some(conn) = self
            .parked
            .as_ref()
            .and_then(|parked| parked.lock().conn.take())
        {
            return Some(conn);
        }
        self.pool.try_get()
    }

    /// Gives back a healthy connection: parks it where the pool parks one, nothing is parked
    /// yet and no caller is inside r2d2's checkout (which would wait for it there); else to
    /// r2d2, which wakes a waiting caller.
    pub(super) fn give_back(&self, conn: r2d2::PooledConnection<M>) {
        if let Some(parked) = &self.parked {
            let mut parked = parked.lock();
            if parked.conn.is_none() && self.waiting.load(Ordering::SeqCst) == 0 {
                parked.conn = Some(conn);
                parked.used = true;
                return;
            }
        }
        drop(conn);
    }

    pub(super) fn state(&self) -> r2d2::State {
        self.pool.state()
    }

    pub(super) fn max_size(&self) -> u32 {
        self.pool.max_size()
    }

    /// To call once a connection flagged broken has been dropped (given back to r2d2, which
    /// closed it): while callers wait, starts a replacement, which wakes one of them when it is
    /// open. A zero-timeout checkout does that: it takes an idle connection if there is one
    /// (given back at once, which wakes a caller too), else starts opening one if the pool has
    /// room, and returns without waiting.
    pub(super) fn discarded(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            drop(self.pool.get_timeout(Duration::ZERO));
        }
    }
}

/// The least time a grant gets to secure its renewal connection, however little is left of
/// the acquire's deadline.
const SECURING_AT_LEAST: Duration = Duration::from_secs(1);

impl<B: Backend> SqlStore<B> {
    /// After a grant of `lock_key`: makes sure the renewal pool has a connection, so that
    /// renewing the lease does not depend on opening one later — a full server would refuse
    /// it ("too many clients") and the lease would run out. Opened here (by `deadline`, at
    /// least [`SECURING_AT_LEAST`]) when the pool has none; the pool keeps it while renewals
    /// use it. If it cannot be opened, the grant is released at once and the caller gets an
    /// error saying why: a lease whose renewals cannot run is not handed out.
    pub(super) fn secure_renewal(
        &self,
        lock_key: &std::sync::Arc<str>,
        grant: &Grant,
        deadline: Instant,
    ) -> Result<()> {
        if self.renewal_pool.state().connections > 0 {
            return Ok(());
        }
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(SECURING_AT_LEAST);
        let failure = match self.renewal_pool.get_timeout(wait) {
            Ok(_connection) => return Ok(()),
            Err(e) => e,
        };
        let released = Store::release(
            self,
            lock_key,
            grant.token,
            Instant::now() + wait,
            Duration::ZERO,
        );
        let given_back = match released {
            Ok(_) => "the lock was granted and given back at once",
            Err(_) => "the lock was granted and is left to expire (giving it back failed too)",
        };
        let mut text = failure.to_string();
        if !text.contains(TOO_MANY_CLIENTS) {
            // The pool's error may not say why (another waiter took its last error): ask once,
            // on a thread of its own, as the pool's own attempts run (the caller may be on a
            // thread of an asynchronous runtime, where a driver cannot block).
            let manager = &self.manager;
            let asked = std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        r2d2::ManageConnection::connect(manager)
                            .err()
                            .map(|e| e.to_string())
                    })
                    .join()
            });
            if let Ok(Some(why)) = asked {
                text = format!("{text}: {why}");
            }
        }
        let hint = if text.contains(TOO_MANY_CLIENTS) {
            format!(
                "{given_back}: its renewal connection could not be opened, \
                 {TOO_MANY_CLIENTS}: {TOO_MANY_CLIENTS_FIX}"
            )
        } else {
            format!(
                "{given_back}: its renewal connection could not be opened ({text}): check the \
                 server and RegistryBuilder::renewal_pool_size"
            )
        };
        Err(Error::Database {
            operation: "acquire",
            hint,
            source: Box::new(failure),
        })
    }
}
